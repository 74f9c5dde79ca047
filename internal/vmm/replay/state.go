package replay

import (
	"warmstart/internal/vmm"
)

var _ vmm.StateChecker = (*VMM)(nil)

// DriverKey is this driver's [vmm] driver key, spelled in package vmm.
const DriverKey = vmm.DriverReplay

// CheckState implements vmm.StateChecker: the replay VMM restores only
// the synthetic state `warmstart synth` writes, which pause children of
// replay restores copy. Anything else (a QEMU stream, a Firecracker
// snapshot) was taken by a VMM that ran a guest the replay VMM cannot
// run, so it is refused before a child starts.
func (v *VMM) CheckState(path string) error {
	_, err := vmm.CheckStateFormat(DriverKey, vmm.FormatReplay, path)
	return err
}
