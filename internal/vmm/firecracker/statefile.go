package firecracker

import (
	"encoding/binary"
	"fmt"
	"regexp"

	"warmstart/internal/vmm"
)

var _ vmm.StateChecker = (*Driver)(nil)

// DriverKey is this driver's [vmm] driver key, spelled in package vmm.
const DriverKey = vmm.DriverFirecracker

// maxStateVersionBytes bounds the snapshot data version string a header
// may carry ("MAJOR.MINOR.PATCH" is far shorter).
const maxStateVersionBytes = 32

var stateVersionPattern = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`)

// ParseStateHeader reads a Firecracker snapshot state file's header from
// its first bytes, as Firecracker's snapshot module writes it with bincode:
// the 64-bit magic id, little endian, then the snapshot data version as a
// string (a little-endian 64-bit length, then "MAJOR.MINOR.PATCH"). It
// returns the magic, the version and the header's length.
func ParseStateHeader(head []byte) (magic uint64, version string, n int, err error) {
	if len(head) < 16 {
		return 0, "", 0, fmt.Errorf("%d bytes, shorter than a snapshot header", len(head))
	}
	magic = binary.LittleEndian.Uint64(head)
	size := binary.LittleEndian.Uint64(head[8:])
	if size > maxStateVersionBytes || uint64(len(head)-16) < size {
		return magic, "", 0, fmt.Errorf("snapshot data version of %d bytes", size)
	}
	version = string(head[16 : 16+size])
	if !stateVersionPattern.MatchString(version) {
		return magic, "", 0, fmt.Errorf("snapshot data version %q is not MAJOR.MINOR.PATCH", version)
	}
	return magic, version, 16 + int(size), nil
}

// CheckState implements vmm.StateChecker: Firecracker loads only a state
// file that opens with its own architecture's magic id and a snapshot
// data version; it answers anything else with an error (after it has
// started). This refuses such a file before Firecracker starts. Whether
// the data version is one the release loads is Firecracker's to say.
func (d *Driver) CheckState(path string) error {
	head, err := vmm.CheckStateFormat(DriverKey, vmm.FormatFirecracker, path)
	if err != nil {
		return err
	}
	refuse := func(detail string) error {
		return &vmm.StateFormatError{Driver: DriverKey, Found: vmm.FormatFirecracker, Want: vmm.FormatFirecracker, Path: path, Detail: detail}
	}
	magic, _, _, err := ParseStateHeader(head)
	if magic != vmm.FirecrackerMagic() {
		return refuse(fmt.Sprintf("magic id %#016x, this host's Firecracker loads only %#016x", magic, vmm.FirecrackerMagic()))
	}
	if err != nil {
		return refuse(err.Error())
	}
	return nil
}
