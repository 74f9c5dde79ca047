package qemu

import (
	"encoding/binary"
	"fmt"

	"warmstart/internal/vmm"
)

var _ vmm.StateChecker = (*Driver)(nil)

// DriverKey is this driver's [vmm] driver key, spelled in package vmm.
const DriverKey = vmm.DriverQEMU

// CheckState implements vmm.StateChecker: a capture saves the guest's
// device state as a migration stream (migrate to "exec:cat > FILE"), so a
// restore takes only a file that opens as QEMU's own incoming migration
// does: the "QEVM" magic, then file version 3, both big endian. QEMU
// refuses anything else once started; this refuses it before.
func (d *Driver) CheckState(path string) error {
	head, err := vmm.CheckStateFormat(DriverKey, vmm.FormatQEMU, path)
	if err != nil {
		return err
	}
	if v := binary.BigEndian.Uint32(head[4:8]); v != vmm.QEMUFileVersion {
		return &vmm.StateFormatError{Driver: DriverKey, Found: vmm.FormatQEMU, Want: vmm.FormatQEMU, Path: path,
			Detail: fmt.Sprintf("stream version %d, QEMU loads only version %d", v, vmm.QEMUFileVersion)}
	}
	return nil
}
