package replay

import (
	"os"

	"warmstart/internal/vmm"
)

var _ vmm.Checker = (*VMM)(nil)

// Check implements vmm.Checker: every restore plays the startup trace, in
// a child running Exe (or this executable).
func (v *VMM) Check() error {
	if err := vmm.CheckFile("[replay] trace", v.TracePath); err != nil {
		return err
	}
	exe := v.Exe
	if exe == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		exe = self
	}
	return vmm.CheckExecutable("the replay VMM executable", exe)
}
