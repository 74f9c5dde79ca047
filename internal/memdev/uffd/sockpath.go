package uffd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// maxSocketPath is the longest path a Unix socket address holds on Linux
// (sun_path is 108 bytes with its terminating NUL).
const maxSocketPath = 107

// linkPrefix starts the name of every short link socketPath makes.
const linkPrefix = "wsu-"

// longestLinkName is the longest name os.MkdirTemp gives a short link: the
// prefix and a random uint32 in decimal.
const longestLinkName = linkPrefix + "4294967295"

// socketPath returns a path for the socket name in dir that bind(2) and
// connect(2) accept however deep dir is. A runtime directory under a long
// TMPDIR or a deep state directory would otherwise fail every uffd
// restore with EINVAL. When dir/name is too long, a short symlink to dir
// is made in the system's temporary directory: the kernel follows
// directory symlinks in a socket's path, so both ends meet in dir. The
// returned cleanup removes that symlink.
//
// A process killed before its cleanup leaves its link behind, so the
// links there whose directory is gone are removed first (see
// sweepDanglingLinks).
func socketPath(dir, name string) (string, func(), error) {
	p := filepath.Join(dir, name)
	if len(p) <= maxSocketPath {
		return p, func() {}, nil
	}
	base := linkBase(name)
	sweepDanglingLinks(base)
	link, err := shortLink(base, dir)
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

// linkBase is the directory short links for the socket name are made in:
// the temporary directory when a link there leaves the socket's path short
// enough, /tmp otherwise.
func linkBase(name string) string {
	base := os.TempDir()
	if len(filepath.Join(base, longestLinkName, name)) > maxSocketPath {
		return "/tmp"
	}
	return base
}

// shortLink makes a symlink with a fresh short name in base pointing at
// dir.
func shortLink(base, dir string) (string, error) {
	reserved, err := os.MkdirTemp(base, linkPrefix)
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

// sweepDanglingLinks removes the short links in base that processes killed
// before their cleanup left behind. Only this user's symlinks named like a
// short link whose directory no longer exists go: such a link serves no
// restore, since a restore's runtime directory outlives its socket. A link
// whose directory exists may belong to a restore running in another
// process and stays, as does anything that is not a symlink. The sweep is
// best effort: a link it cannot remove does not stop this restore.
func sweepDanglingLinks(base string) {
	links, err := filepath.Glob(filepath.Join(base, linkPrefix+"*"))
	if err != nil {
		return // only a malformed pattern, which this one is not
	}
	uid := os.Getuid()
	for _, link := range links {
		if danglingLinkOf(link, uid) {
			os.Remove(link)
		}
	}
}

// danglingLinkOf reports whether path is a symlink owned by uid whose
// target does not exist.
func danglingLinkOf(path string, uid int) bool {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return false
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != uid {
		return false
	}
	_, err = os.Stat(path)
	return errors.Is(err, fs.ErrNotExist)
}
