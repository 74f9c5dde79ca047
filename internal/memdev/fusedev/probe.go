package fusedev

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// ProbeTimeout bounds one probe of a mount whose server may be dead. A
// statfs on a FUSE mount waits for its server; a server that is stopped
// (SIGSTOP, a debugger) but not dead would hold the caller there without
// end, and with it a daemon's start-up or its SIGTERM. Live servers answer
// statfs from memory in microseconds.
const ProbeTimeout = 2 * time.Second

// ErrMountUnresponsive: a FUSE mount neither answers nor reports its server
// gone. It also matches ErrMountBusy, since the mount is not known to be
// dead and is left alone.
var ErrMountUnresponsive = errors.New("FUSE mount does not answer (is its server stopped?)")

// unresponsiveError matches both ErrMountUnresponsive and ErrMountBusy.
type unresponsiveError struct{ dir string }

func (e *unresponsiveError) Error() string {
	return fmt.Sprintf("%v: %s within %v", ErrMountUnresponsive, e.dir, ProbeTimeout)
}

func (e *unresponsiveError) Is(target error) bool {
	return target == ErrMountUnresponsive || target == ErrMountBusy
}

// statfsWithin is statfs(2) of dir that gives up after ProbeTimeout. The
// system call cannot be cancelled: on a timeout its goroutine (and thread)
// stays blocked until the server answers or dies, which ends the call.
func statfsWithin(dir string) error {
	done := make(chan error, 1)
	go func() {
		var st unix.Statfs_t
		done <- unix.Statfs(dir, &st)
	}()
	timer := time.NewTimer(ProbeTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return &unresponsiveError{dir: dir}
	}
}
