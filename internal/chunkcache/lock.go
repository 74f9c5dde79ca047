package chunkcache

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Several processes may open one cache directory at once: a daemon and a
// read-only CLI verb (restore, verify) on the same node, each with its own
// index. Open's clean-up (temporary files, blocks of another size, torn
// blocks, eviction down to the bound) would delete what another process is
// writing or serving, so only a process that has the directory to itself
// does it. Every open cache holds a shared flock(2) on lockFileName until
// Close; Open first tries the exclusive lock without waiting: taking it
// proves no other cache is open there, and the clean-up runs under it.
// The kernel drops the lock when its holder dies, so a crashed holder
// never keeps the next Open from cleaning up.
const lockFileName = "lock"

// dirLock is an open cache's flock on its directory.
type dirLock struct {
	f *os.File
	// alone is true when Open held the lock exclusively: no other process
	// had the directory open, so clean-up was safe.
	alone bool
}

// lockDir takes the directory lock: exclusive if nobody holds it (then
// clean, which runs under it), shared otherwise. It returns holding the
// shared lock either way.
func lockDir(dir string, clean func(alone bool) error) (*dirLock, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	l := &dirLock{f: f}
	err = flock(f, unix.LOCK_EX|unix.LOCK_NB)
	switch {
	case err == nil:
		l.alone = true
	case errors.Is(err, unix.EWOULDBLOCK):
	default:
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	if err := clean(l.alone); err != nil {
		f.Close()
		return nil, err
	}
	// Converting to shared is not atomic (flock drops the old lock first),
	// so another Open may take the exclusive lock in between; blocking
	// here then waits until its clean-up is done. This cache has written
	// nothing yet, so that clean-up cannot remove anything of ours.
	if err := flock(f, unix.LOCK_SH); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s shared: %w", f.Name(), err)
	}
	return l, nil
}

func (l *dirLock) release() error { return l.f.Close() }

// flock retries when a signal interrupts the call.
func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
