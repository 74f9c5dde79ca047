// Package untrusted opens the files warmstart trusts least — snapshot artifacts,
// startup manifests and configuration files — so that a path an operator or
// an attacker put something odd at (a symlink, a FIFO, a device, a
// directory, /dev/zero) fails at once with an error naming it, instead of
// blocking in open(2) or reading without bound.
package untrusted

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrNotRegular is wrapped when a path names something other than a regular
// file, or a symlink.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is wrapped when a file is longer than a reader's bound.
var ErrTooLarge = errors.New("file too large")

// Open opens path read-only without following a final symlink and
// without blocking (a FIFO or a device would otherwise block or stream), and
// returns it only if it is a regular file. The returned file is in blocking
// mode again, so reads behave as usual.
func Open(path string) (*os.File, error) {
	return openRegular(path, unix.O_NOFOLLOW)
}

// OpenFollowing is Open for a file an operator names
// directly (a trace given with --trace): a symlink to a regular file is
// followed, and anything else still fails at once.
func OpenFollowing(path string) (*os.File, error) {
	return openRegular(path, 0)
}

func openRegular(path string, flags int) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|flags|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) && flags&unix.O_NOFOLLOW != 0 {
		return nil, fmt.Errorf("open %s: %w: it is a symlink", path, ErrNotRegular)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return regularFile(fd, path)
}

// ErrOutside is wrapped when a path resolved beneath a directory leads out
// of it.
var ErrOutside = errors.New("leads outside its directory")

// ErrNoOpenat2 is wrapped when the kernel (before Linux 5.6) or a seccomp
// profile does not offer openat2, which OpenBeneath needs.
var ErrNoOpenat2 = errors.New("openat2 (Linux 5.6 or later) is not available")

// OpenBeneath is OpenFollowing for rel, a path relative to
// dir, whose every component is resolved beneath dir (openat2 with
// RESOLVE_BENEATH): a "..", an absolute symlink (even one naming a file
// inside dir: the kernel refuses them all) or a relative one that climbs
// out of dir fails with ErrOutside during the walk, before anything
// outside dir is looked at, so the error is the same whatever is there.
// Relative symlinks that stay inside dir are followed. The check and the
// open are one step, so no path swapped afterwards can change what the
// returned file reads.
func OpenBeneath(dir, rel string) (*os.File, error) {
	path := filepath.Join(dir, rel)
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(d)
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := unix.Openat2(d, rel, &how)
	// A rename or mount racing a ".." step makes the kernel refuse the walk
	// with EAGAIN rather than risk a wrong answer; openat2(2) says retry.
	for try := 0; errors.Is(err, unix.EAGAIN) && try < 3; try++ {
		fd, err = unix.Openat2(d, rel, &how)
	}
	switch {
	case errors.Is(err, unix.EXDEV):
		return nil, fmt.Errorf("open %s: %w %s", path, ErrOutside, dir)
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
		return nil, fmt.Errorf("open %s: %w: %w", path, ErrNoOpenat2, err)
	case errors.Is(err, unix.ENXIO):
		// open(2) of a Unix socket, or of a device no driver answers.
		return nil, fmt.Errorf("open %s: %w: it is a socket or a device without a driver", path, ErrNotRegular)
	case err != nil:
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return regularFile(fd, path)
}

// regularFile wraps fd, opened non-blocking, if it is a regular file, and
// puts it back in blocking mode; else it closes fd.
func regularFile(fd int, path string) (*os.File, error) {
	f := os.NewFile(uintptr(fd), path)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("open %s: %w: it is a %s", path, ErrNotRegular, KindOf(fi.Mode()))
	}
	// O_NONBLOCK has no effect on regular files, but clear it so nothing
	// downstream sees an unexpected flag.
	if err := unix.SetNonblock(fd, false); err != nil {
		f.Close()
		return nil, fmt.Errorf("open %s: clear O_NONBLOCK: %w", path, err)
	}
	return f, nil
}

// ReadBounded reads the whole regular file at path, refusing one longer
// than limit bytes before reading more than limit+1 of them.
func ReadBounded(path string, limit int64) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("read %s: %w: more than %d bytes", path, ErrTooLarge, limit)
	}
	return data, nil
}

// KindOf names what a file that is not regular is, for errors.
func KindOf(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "symlink"
	case m.IsDir():
		return "directory"
	case m&os.ModeNamedPipe != 0:
		return "FIFO"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeCharDevice != 0:
		return "character device"
	case m&os.ModeDevice != 0:
		return "block device"
	}
	return "special file"
}
