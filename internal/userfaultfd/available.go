package userfaultfd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// DevicePath is the character device through which Linux 6.1 and later
// also hand out userfaultfds. Access to it is governed by its file
// permissions rather than by vm.unprivileged_userfaultfd, and it is how
// Firecracker's documentation has an unprivileged VMM create them.
const DevicePath = "/dev/userfaultfd"

// ErrUnavailable is wrapped by CheckAvailable's error.
var ErrUnavailable = errors.New("userfaultfd unavailable")

// CheckAvailable reports whether a process with this process's credentials
// (a VMM it starts) can create a userfaultfd the way Firecracker does, one
// that handles kernel-mode faults: through DevicePath if it may open it,
// else through the userfaultfd system call. Its error names the fix.
func CheckAvailable() error {
	dev, devErr := os.OpenFile(DevicePath, os.O_RDWR|unix.O_CLOEXEC, 0)
	if devErr == nil {
		return dev.Close()
	}
	r, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, uintptr(unix.O_CLOEXEC|unix.O_NONBLOCK), 0, 0)
	if errno == 0 {
		return unix.Close(int(r))
	}
	return unavailable(errno, devErr)
}

// unavailable explains why neither way of creating a userfaultfd worked:
// the system call failed with errno, opening DevicePath with devErr.
func unavailable(errno syscall.Errno, devErr error) error {
	switch errno {
	case unix.ENOSYS:
		return fmt.Errorf("%w: this kernel has no userfaultfd system call (it was built without CONFIG_USERFAULTFD): the Uffd backend needs a kernel that has it, or use the file device", ErrUnavailable)
	case unix.EPERM:
		fix := "run warmstart as root (or with CAP_SYS_PTRACE), or set the sysctl vm.unprivileged_userfaultfd=1"
		if !errors.Is(devErr, fs.ErrNotExist) {
			fix += fmt.Sprintf(", or give this user read-write access to %s (e.g. setfacl -m u:$USER:rw %s)", DevicePath, DevicePath)
		}
		return fmt.Errorf("%w: the userfaultfd system call is not permitted for this user (%v) and %s cannot be opened (%v): %s", ErrUnavailable, errno, DevicePath, devErr, fix)
	}
	return fmt.Errorf("%w: userfaultfd: %v; %s: %v", ErrUnavailable, errno, DevicePath, devErr)
}
