package firecracker

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/vmm"
)

// foreignStates are state files Firecracker cannot load, with the format
// each is and what the refusal says about it.
func foreignStates() map[string]struct {
	data  []byte
	found vmm.StateFormat
	says  string
} {
	other := vmm.FirecrackerMagicARM
	if vmm.FirecrackerMagic() == other {
		other = vmm.FirecrackerMagicX86
	}
	otherArch := binary.LittleEndian.AppendUint64(nil, other)
	otherArch = binary.LittleEndian.AppendUint64(otherArch, 5)
	otherArch = append(otherArch, "8.0.0{}"...)
	return map[string]struct {
		data  []byte
		found vmm.StateFormat
		says  string
	}{
		"qemu":       {[]byte("QEVM\x00\x00\x00\x03\x07\x00\x00"), vmm.FormatQEMU, `driver = "qemu"`},
		"replay":     {[]byte(vmm.ReplayStateMagic + "\nseed 1\n"), vmm.FormatReplay, `driver = "replay"`},
		"other arch": {otherArch, vmm.FormatFirecracker, "magic id"},
		"unknown":    {[]byte(`{"vcpu_count":1,"mem_size_mib":8}`), vmm.FormatUnknown, "unknown format"},
	}
}

// The driver refuses a state Firecracker cannot load before it starts
// Firecracker, naming what the file is and the driver key.
func TestRestoreRefusesForeignState(t *testing.T) {
	records := filepath.Join(t.TempDir(), "records")
	d := newTestDriver(t, fakeConfig{RecordPath: records}, nil)
	for name, c := range foreignStates() {
		t.Run(name, func(t *testing.T) {
			spec := fileRestore(t, 8)
			if err := os.WriteFile(spec.VMStatePath, c.data, 0o600); err != nil {
				t.Fatal(err)
			}
			m, err := d.Restore(t.Context(), spec)
			if err == nil {
				m.RequestStop()
				t.Fatal("a foreign state restored")
			}
			var fe *vmm.StateFormatError
			if !errors.As(err, &fe) || !errors.Is(err, vmm.ErrForeignState) || fe.Found != c.found {
				t.Fatalf("Restore = %v, want a refusal finding %s", err, c.found)
			}
			for _, want := range []string{`[vmm] driver = "firecracker"`, c.says} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if entries, _ := os.ReadDir(spec.RuntimeDir); len(entries) != 0 {
				t.Errorf("Firecracker was started: %d files in the runtime directory", len(entries))
			}
		})
	}
	if _, err := os.Stat(records); err == nil {
		t.Error("the fake Firecracker answered a request for a refused state")
	}
}

// The fake fails a load of a foreign file as Firecracker's snapshot load
// does, and reads back what it writes.
func TestFakeStateHeader(t *testing.T) {
	for name, c := range foreignStates() {
		var m MachineConfig
		err := decodeFakeState(c.data, &m)
		if err == nil || !strings.Contains(err.Error(), "Load snapshot error") {
			t.Errorf("%s: the fake loaded a foreign state: %v", name, err)
		}
		if name == "other arch" && !strings.Contains(err.Error(), "Magic value does not match arch") {
			t.Errorf("%s: %v, want Firecracker's magic error", name, err)
		}
	}
	data, err := encodeFakeState(MachineConfig{VCPUCount: 1, MemSizeMiB: 8})
	if err != nil {
		t.Fatal(err)
	}
	if got := vmm.DetectStateFormat(data); got != vmm.FormatFirecracker {
		t.Fatalf("the fake's state reads as %s", got)
	}
	magic, version, _, err := ParseStateHeader(data)
	if err != nil || magic != vmm.FirecrackerMagic() || version != fakeStateVersion {
		t.Fatalf("header = %#x %q %v", magic, version, err)
	}
	var m MachineConfig
	if err := decodeFakeState(data, &m); err != nil || m.MemSizeMiB != 8 {
		t.Fatalf("decode = %+v, %v", m, err)
	}
}
