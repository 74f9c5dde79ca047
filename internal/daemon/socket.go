package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"warmstart/internal/config"
)

// Whoever can connect to the API socket can run VMs, so no other user may
// reach it at any instant. Three defences, each enough on its own against
// the attack of a local user spinning on connect() while the daemon
// starts:
//
//  1. The runtime directory, which holds the socket by default, the VMs'
//     own sockets and the token, is the daemon user's alone: created 0700,
//     tightened to 0700 when it exists open to others, refused when
//     another user owns it (privateRuntimeDir).
//  2. The socket is born private: bound inside a fresh 0700 directory,
//     made 0600 there and only then linked into place (listenPrivate), so
//     its name never points at a socket others may open, whatever the
//     umask. The process umask is not used for this: it is shared by every
//     thread, and the daemon's other goroutines create files while it
//     starts (recordings it resumes, its FUSE mount), which a temporarily
//     narrowed umask would give the wrong modes.
//  3. Every accepted connection's peer credentials (SO_PEERCRED) are
//     checked: only the daemon's user and root are answered (ownerOnly),
//     should an operator ever open the socket up by hand.

// socketPathLimit is the longest path a Unix socket address holds
// (sockaddr_un less its terminating NUL).
const socketPathLimit = 107

// msgRefusedPeer is logged, at most every refusedLogInterval after the
// first few, when a connection from another user is refused.
const msgRefusedPeer = "refused a connection to the API socket from another user"

const refusedLogInterval = time.Minute

// privateRuntimeDir makes dir, the runtime directory, one that only the
// daemon's user can enter.
func privateRuntimeDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("daemon: runtime directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("daemon: runtime directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("daemon: runtime directory %s is not a directory", dir)
	}
	if owner := fileOwner(fi); owner != os.Geteuid() {
		return fmt.Errorf("daemon: runtime directory %s belongs to uid %d, not to the daemon's uid %d: "+
			"its owner could reach the API socket and the VMs' sockets in it; give it to uid %d or configure another [runtime] dir",
			dir, owner, os.Geteuid(), os.Geteuid())
	}
	perm := fi.Mode().Perm()
	if perm&0o077 == 0 {
		return nil
	}
	if err := checkNotShared(dir, fi); err != nil {
		return fmt.Errorf("daemon: runtime directory %s (mode %#o) lets other users in, and %w: "+
			"the daemon tightens only a directory of its own; configure one, such as %s",
			dir, unixMode(fi), err, "/run/warmstart")
	}
	if err := os.Chmod(dir, perm&0o700); err != nil {
		return fmt.Errorf("daemon: tighten runtime directory %s: %w", dir, err)
	}
	log.Warn("tightened the runtime directory: other users could enter it", "dir", dir,
		"mode_was", fmt.Sprintf("%#o", perm), "mode", fmt.Sprintf("%#o", perm&0o700))
	return nil
}

// checkNotShared refuses to let the daemon tighten a directory other
// users rely on: a sticky one that holds anything warmstart does not put
// in a runtime directory (/tmp, /var/tmp; a tmpfs freshly mounted for the
// daemon is sticky too, and empty), the file system's root, and one
// holding another user's files (/home). Taking it from them would break
// the host, not protect the socket.
func checkNotShared(dir string, fi os.FileInfo) error {
	if parent, err := os.Stat(filepath.Join(dir, "..")); err == nil && os.SameFile(fi, parent) {
		return errors.New("it is the file system's root")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("its entries cannot be read: %w", err)
	}
	sticky := fi.Mode()&os.ModeSticky != 0
	for _, e := range entries {
		if sticky && !runtimeEntry(e.Name()) {
			return fmt.Errorf("it is a sticky directory shared by every user: it holds %s", e.Name())
		}
		info, err := e.Info()
		if err != nil {
			continue // removed since the listing
		}
		if owner := fileOwner(info); owner != os.Geteuid() {
			return fmt.Errorf("it holds %s of uid %d", e.Name(), owner)
		}
	}
	return nil
}

// runtimeEntry reports whether name is one warmstart puts in a runtime
// directory (the daemon's, a CLI verb's, a capture's, the probe and
// initramfs caches, a socket's temporary directory), or lost+found.
func runtimeEntry(name string) bool {
	switch name {
	case runDirName, instanceLockName, config.DefaultFUSEMountName, config.DefaultFUSEMountName + "-prefetching",
		"trace-mem", config.DefaultSocketName, config.DefaultTokenFileName, "probe", "initramfs", "lost+found":
		return true
	}
	for _, prefix := range []string{"cli-", "capture-", ".ws"} {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// checkSocketDir creates the socket's directory if it is missing and
// refuses one where another user could replace the socket: owned by a
// user other than the daemon's and root, or writable by others without
// the sticky bit. (One that others may enter is fine: the socket itself
// is private.)
func checkSocketDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("socket directory: %w", err)
	}
	if owner := fileOwner(fi); owner != os.Geteuid() && owner != 0 {
		return fmt.Errorf("socket directory %s belongs to uid %d: that user could replace the socket", dir, owner)
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0 {
		return fmt.Errorf("socket directory %s (mode %#o) is writable by other users without the sticky bit: they could replace the socket",
			dir, fi.Mode().Perm())
	}
	return nil
}

// unixMode is fi's permission bits with the sticky bit as chmod writes it.
func unixMode(fi os.FileInfo) os.FileMode {
	if fi.Mode()&os.ModeSticky != 0 {
		return fi.Mode().Perm() | 0o1000
	}
	return fi.Mode().Perm()
}

func fileOwner(fi os.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// listenPrivate listens on a Unix socket at path, mode 0600, that no other
// user could open at any moment of its creation (see above). It fails if
// anything is at path by then (something appeared since the stale-socket
// check). It returns the socket file's information, to recognise it at
// shutdown.
func listenPrivate(path string) (*net.UnixListener, os.FileInfo, error) {
	// The link below would take a longer path, but no client could
	// connect to it.
	if len(path) > socketPathLimit {
		return nil, nil, fmt.Errorf("[daemon] socket %s is %d bytes, longer than the %d a Unix socket address holds: "+
			"no client could connect to it; use a shorter path", path, len(path), socketPathLimit)
	}
	// MkdirTemp makes the directory 0700, which the umask can only narrow.
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".ws")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(tmp)
	bound := filepath.Join(tmp, "s")
	if len(bound) > socketPathLimit {
		return nil, nil, fmt.Errorf("the socket is first bound at %s, %d bytes, longer than the %d a Unix socket allows: use a shorter [daemon] socket path",
			bound, len(bound), socketPathLimit)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: bound, Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	// The socket is removed as the last step of shutdown, not when the
	// listener closes at the first.
	ln.SetUnlinkOnClose(false)
	fi, err := publishSocket(bound, path)
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	return ln, fi, nil
}

// publishSocket makes the socket bound at bound private and links it to
// path: a link, unlike a rename, never replaces what is there.
func publishSocket(bound, path string) (os.FileInfo, error) {
	if err := os.Chmod(bound, 0o600); err != nil {
		return nil, err
	}
	made, err := os.Lstat(bound)
	if err != nil {
		return nil, err
	}
	if err := os.Link(bound, path); err != nil {
		return nil, err
	}
	fi, err := os.Lstat(path)
	if err == nil && !os.SameFile(fi, made) {
		err = fmt.Errorf("%s changed while it was being created", path)
	}
	if err != nil {
		return nil, err
	}
	return fi, nil
}

// ownerOnly is a Unix listener that closes, unanswered, every connection
// whose peer is neither uid nor root.
type ownerOnly struct {
	*net.UnixListener
	uid     uint32
	log     *slog.Logger
	refused atomic.Uint64
	// logs bounds the warnings a user spinning on connect can cause.
	logs rate.Sometimes
}

func newOwnerOnly(ln *net.UnixListener, uid int, log *slog.Logger) *ownerOnly {
	return &ownerOnly{UnixListener: ln, uid: uint32(uid), log: log, logs: rate.Sometimes{First: 3, Interval: refusedLogInterval}}
}

// Accept returns the next connection of the daemon's user or root.
func (l *ownerOnly) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		cred, err := peerCredentials(c)
		if err == nil && (cred.Uid == l.uid || cred.Uid == 0) {
			return c, nil
		}
		c.Close()
		n := l.refused.Add(1)
		l.logs.Do(func() {
			if err != nil {
				l.log.Warn(msgRefusedPeer, "err", err, "refused", n)
				return
			}
			l.log.Warn(msgRefusedPeer, "peer_uid", cred.Uid, "peer_pid", cred.Pid, "refused", n)
		})
	}
}

// peerCredentials are the credentials the peer of c connected with.
func peerCredentials(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := rc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, fmt.Errorf("peer credentials: %w", credErr)
	}
	if cred == nil {
		return nil, errors.New("peer credentials: none")
	}
	return cred, nil
}
