package firecracker

import (
	"fmt"
	"os"

	"warmstart/internal/userfaultfd"
	"warmstart/internal/vmm"
)

// kvmDevice is what every Firecracker VM opens.
const kvmDevice = "/dev/kvm"

var _ vmm.Checker = (*Driver)(nil)

// Check implements vmm.Checker: a restore needs the Firecracker binary and
// /dev/kvm, and with Options.Uffd a userfaultfd that Firecracker, running
// with this process's credentials, may create. It needs no kernel or root
// file system: a snapshot carries the guest's state, and its drives are
// whatever the snapshot names. The release is asked at each launch, since
// the binary may change under a running daemon.
func (d *Driver) Check() error {
	if err := vmm.CheckExecutable("[firecracker] binary", d.opts.Binary); err != nil {
		return err
	}
	fi, err := os.Stat(kvmDevice)
	if err != nil {
		return fmt.Errorf("%w: firecracker needs %s: %v", vmm.ErrUnusable, kvmDevice, err)
	}
	if fi.Mode()&os.ModeCharDevice == 0 {
		return fmt.Errorf("%w: %s is not a character device", vmm.ErrUnusable, kvmDevice)
	}
	if d.opts.Uffd {
		if err := userfaultfd.CheckAvailable(); err != nil {
			return fmt.Errorf("%w: firecracker's Uffd backend: %w", vmm.ErrUnusable, err)
		}
	}
	return nil
}
