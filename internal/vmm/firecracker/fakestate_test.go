package firecracker

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"warmstart/internal/vmm"
)

// fakeStateVersion is the snapshot data version the fake writes in its
// state files' header. A real release writes its own (persist.rs's
// SNAPSHOT_VERSION) and checks a loaded one against it; the fake plays no
// such table and takes any well-formed version.
const fakeStateVersion = "8.0.0"

// encodeFakeState is a state file as the fake writes it: Firecracker's
// header (this architecture's magic id, then the data version, as bincode
// encodes them) followed by the fake's state, its machine config in JSON
// where Firecracker has its bincode-encoded microVM state.
func encodeFakeState(machine any) ([]byte, error) {
	body, err := json.Marshal(machine)
	if err != nil {
		return nil, err
	}
	head := binary.LittleEndian.AppendUint64(nil, vmm.FirecrackerMagic())
	head = binary.LittleEndian.AppendUint64(head, uint64(len(fakeStateVersion)))
	return append(append(head, fakeStateVersion...), body...), nil
}

// decodeFakeState reads a state file as the fake loads it, failing as
// Firecracker's snapshot load does on a file without its header: another
// architecture's magic id, or no snapshot at all.
func decodeFakeState(data []byte, machine any) error {
	const prefix = "Load snapshot error: Failed to restore from snapshot: Failed to get snapshot state from file: " +
		"Failed to load snapshot state from file: Snapshot error: "
	magic, _, n, err := ParseStateHeader(data)
	if len(data) >= 8 && magic != vmm.FirecrackerMagic() {
		return fmt.Errorf("%sMagic value does not match arch: %d", prefix, magic)
	}
	if err != nil {
		return fmt.Errorf("%sAn error occured with serialization/deserialization: %v", prefix, err)
	}
	if err := json.Unmarshal(data[n:], machine); err != nil {
		return fmt.Errorf("%sAn error occured with serialization/deserialization: %v", prefix, err)
	}
	return nil
}
