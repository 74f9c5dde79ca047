package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"warmstart/internal/untrusted"
)

// One daemon per runtime directory: the first takes an exclusive flock on
// <runtime>/daemon.lock before it touches anything there (its socket, the
// restore directories of a crashed run, its FUSE mounts), and holds it
// until it exits; the kernel drops it if the daemon dies. A second daemon
// with the same configuration fails at once, naming the holder, instead
// of deleting a live daemon's restore directories or hanging in a probe of
// its mounts.

// ErrRuntimeDirInUse is returned when another daemon holds the runtime
// directory's lock.
var ErrRuntimeDirInUse = errors.New("another warmstart daemon holds the runtime directory")

const instanceLockName = "daemon.lock"

// instanceLock is the held lock; release closes it.
type instanceLock struct{ f *os.File }

// lockRuntimeDir takes the runtime directory's daemon lock without
// waiting, and writes this process's id into the lock file for the next
// one to name.
func lockRuntimeDir(runtimeDir string) (*instanceLock, error) {
	if err := os.MkdirAll(runtimeDir, 0o700); err != nil {
		return nil, fmt.Errorf("daemon: runtime directory: %w", err)
	}
	path := filepath.Join(runtimeDir, instanceLockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("daemon: lock %s: %w", path, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = fmt.Errorf("%w: it is a %s; remove it", untrusted.ErrNotRegular, untrusted.KindOf(fi.Mode()))
		}
		return nil, fmt.Errorf("daemon: lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := readHolder(f)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("daemon: %s: %w (pid %s): %w", runtimeDir, ErrRuntimeDirInUse, holder, ErrAlreadyRunning)
		}
		return nil, fmt.Errorf("daemon: lock %s: %w", path, err)
	}
	if err := writeHolder(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("daemon: lock %s: %w", path, err)
	}
	return &instanceLock{f: f}, nil
}

func readHolder(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	if pid := strings.TrimSpace(string(b[:n])); pid != "" {
		return pid
	}
	return "unknown"
}

func writeHolder(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return err
}

func (l *instanceLock) release() {
	if l != nil && l.f != nil {
		l.f.Close()
	}
}
