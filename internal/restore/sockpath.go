package restore

import (
	"fmt"
	"os"
	"path/filepath"
)

// maxSocketPath is the longest path a Unix socket address holds on Linux
// (sun_path is 108 bytes with its terminating NUL).
const maxSocketPath = 107

// socketPath returns a path for the socket name in dir that bind(2) and
// connect(2) accept however deep dir is. A runtime directory under a long
// TMPDIR or a deep state directory would otherwise fail every uffd
// restore with EINVAL. When dir/name is too long, a short symlink to dir
// is made in the system's temporary directory: the kernel follows
// directory symlinks in a socket's path, so both ends meet in dir. The
// returned cleanup removes that symlink.
func socketPath(dir, name string) (string, func(), error) {
	p := filepath.Join(dir, name)
	if len(p) <= maxSocketPath {
		return p, func() {}, nil
	}
	link, err := shortLink(dir)
	if err != nil {
		return "", nil, fmt.Errorf("socket path %s is %d bytes, over %d, and no short link could be made: %w", p, len(p), maxSocketPath, err)
	}
	short := filepath.Join(link, name)
	if len(short) > maxSocketPath {
		os.Remove(link)
		return "", nil, fmt.Errorf("socket path %s is %d bytes, over %d, even through %s", p, len(p), maxSocketPath, link)
	}
	return short, func() { os.Remove(link) }, nil
}

// shortLink makes a symlink with a fresh short name in the temporary
// directory (or /tmp when TMPDIR is itself long) pointing at dir.
func shortLink(dir string) (string, error) {
	base := os.TempDir()
	if len(base) > 32 {
		base = "/tmp"
	}
	reserved, err := os.MkdirTemp(base, "wsu-")
	if err != nil {
		return "", err
	}
	// MkdirTemp picks a unique name; the symlink takes its place.
	if err := os.Remove(reserved); err != nil {
		return "", err
	}
	if err := os.Symlink(dir, reserved); err != nil {
		return "", err
	}
	return reserved, nil
}
