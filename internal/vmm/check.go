package vmm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// ErrUnusable is wrapped by a driver's Check when this host cannot restore
// with it as configured.
var ErrUnusable = errors.New("VMM unusable on this host")

// Checker is implemented by drivers that can tell, before the first
// restore, whether this host can run them as configured: the binary is
// there and executable, and every file a restore needs exists. Each driver
// knows what it needs; callers only ask.
type Checker interface {
	Check() error
}

// Check asks v whether it can restore here; a driver that cannot tell is
// taken to be able.
func Check(v VMM) error {
	if c, ok := v.(Checker); ok {
		return c.Check()
	}
	return nil
}

// CheckExecutable finds the program a driver runs (a path, or a name on
// PATH) and checks it is an executable regular file. what names it in the
// error, e.g. "[firecracker] binary".
func CheckExecutable(what, program string) error {
	if program == "" {
		return fmt.Errorf("%w: %s is not set", ErrUnusable, what)
	}
	if _, err := exec.LookPath(program); err != nil {
		return fmt.Errorf("%w: %s %s: %v", ErrUnusable, what, program, err)
	}
	return nil
}

// CheckFile checks that path names a regular file (symlinks followed).
func CheckFile(what, path string) error {
	if path == "" {
		return fmt.Errorf("%w: %s is not set", ErrUnusable, what)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrUnusable, what, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s %s is not a regular file", ErrUnusable, what, path)
	}
	return nil
}

// BackendChecker is implemented by drivers that restore with some memory
// backends only (QEMU has no Uffd backend); a driver that does not
// implement it restores with every backend. The answer depends on the
// driver alone, so a caller asks before anything of a restore starts.
type BackendChecker interface {
	CheckBackend(b Backend) error
}

// CheckBackend asks v whether it restores with memory backend b.
func CheckBackend(v VMM, b Backend) error {
	if c, ok := v.(BackendChecker); ok {
		return c.CheckBackend(b)
	}
	return nil
}
