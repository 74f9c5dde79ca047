package qemu

import (
	"os"

	"warmstart/internal/vmm"
)

var _ vmm.Checker = (*Driver)(nil)

// Check implements vmm.Checker: a restore runs the QEMU binary (New found
// it; it may have gone since) through the launcher, this executable. The
// kernel is needed only to boot a capture, so only a kernel that is
// configured yet missing is reported.
func (d *Driver) Check() error {
	if err := vmm.CheckExecutable("[qemu] binary", d.opts.Binary); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := vmm.CheckExecutable("the qemu launcher (this executable)", self); err != nil {
		return err
	}
	if d.opts.Kernel != "" {
		return vmm.CheckFile("[qemu] kernel", d.opts.Kernel)
	}
	return nil
}
