package uffd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev"
	"warmstart/internal/userfaultfd"
)

// HandshakeTimeout bounds how long Accept waits for a connected VMM's
// handshake.
const HandshakeTimeout = 10 * time.Second

// DefaultConnectTimeout is how long a restore waits for its VMM to connect
// when nothing else is configured. Firecracker connects while it loads the
// snapshot, and the replay VMM within milliseconds of starting.
const DefaultConnectTimeout = 10 * time.Second

// DefaultInstallChunkBytes is the largest run Install reads from the lower
// file and copies into the guest in one UFFDIO_COPY.
const DefaultInstallChunkBytes = 1 << 20

var (
	// ErrBadHandshake is wrapped by every error that rejects a VMM's
	// handshake: malformed JSON, invalid mappings, a missing or foreign fd.
	ErrBadHandshake = userfaultfd.ErrBadHandshake
	// ErrClosed is returned by operations on a closed Handler or Session.
	ErrClosed = errors.New("uffd handler closed")
	// ErrSocketInUse is returned by Listen when another handler serves the path.
	ErrSocketInUse = errors.New("uffd socket already in use")
	// ErrExitedBeforeConnect is wrapped by AcceptWith's error when the VMM
	// it waits for exited without connecting.
	ErrExitedBeforeConnect = errors.New("VMM exited before connecting")
	// ErrConnectTimeout is wrapped by AcceptWith's error when no VMM
	// connected within AcceptOptions.ConnectTimeout.
	ErrConnectTimeout = errors.New("no VMM connected")
)

// Options tune a Handler and the sessions it accepts.
type Options struct {
	// Trace starts access tracing as each session begins, so that the
	// VM's very first fault is recorded.
	Trace bool
	// InstallChunkBytes bounds one Install run; DefaultInstallChunkBytes
	// when zero. It is raised to the region's page size when smaller.
	InstallChunkBytes int
	// Observer, when not nil, is told of every page a fault brought in
	// (memdev.Demand) and every run an Install copied (memdev.Prefetch).
	// A page Install placed before the guest reached it never faults, so
	// a touch of a prefetched page is invisible here.
	Observer memdev.Observer

	hooks *testHooks
}

// testHooks let tests stop the handler at the points where races with the
// kernel decide the outcome. Nil in production.
type testHooks struct {
	// beforeFaultCopy runs on the serving goroutine after the page is found
	// neither removed nor present and read, before UFFDIO_COPY.
	beforeFaultCopy func(logical int64)
	// beforeInstallCopy runs on the installing goroutine before it takes the
	// removal lock and copies [logical, logical+length).
	beforeInstallCopy func(logical, length int64)
}

// Handler listens on a Unix socket for VMMs restoring one snapshot whose
// guest memory is the lower, and serves each one's page faults.
// One handler per VM is how Firecracker is deployed; a Handler also accepts
// several VMMs in turn or at once, each as its own Session.
type Handler struct {
	socketPath string
	ln         *net.UnixListener
	// lower is what sessions read pages through: a memdev.Memory checks
	// every block against its digest table before the page is copied in
	// (a fault on a bad block then fails the session, ErrLowerFile with
	// the *integrity.BlockError in the chain).
	lower memdev.Lower
	opts  Options

	acceptMu sync.Mutex
	// closing is cancelled by Close, to abandon a handshake in progress.
	closing     context.Context
	markClosing context.CancelFunc

	mu       sync.Mutex
	sessions map[*Session]struct{}
	closed   bool
}

// Listen listens on socketPath for VMMs whose guest memory lower serves.
// A stale socket file that nobody listens on is replaced. On success the
// handler owns lower and closes it on Close; on failure the caller still
// owns it.
func Listen(socketPath string, lower memdev.Lower, opts Options) (*Handler, error) {
	if opts.InstallChunkBytes < 0 {
		return nil, fmt.Errorf("uffd listen: negative install chunk %d", opts.InstallChunkBytes)
	}
	if opts.InstallChunkBytes == 0 {
		opts.InstallChunkBytes = DefaultInstallChunkBytes
	}
	opts.InstallChunkBytes = max(userfaultfd.PageSizeBytes, opts.InstallChunkBytes/userfaultfd.PageSizeBytes*userfaultfd.PageSizeBytes)
	if err := removeStaleSocket(socketPath); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socketPath, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("uffd listen on %s: %w", socketPath, err)
	}
	// The listener unlinks the socket file when closed.
	ln.SetUnlinkOnClose(true)
	closing, markClosing := context.WithCancel(context.Background())
	return &Handler{
		socketPath:  socketPath,
		ln:          ln,
		lower:       lower,
		opts:        opts,
		closing:     closing,
		markClosing: markClosing,
		sessions:    make(map[*Session]struct{}),
	}, nil
}

// removeStaleSocket deletes a socket file left by a handler that died, and
// refuses to take over one that still accepts connections.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("uffd listen: stat %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("uffd listen: %s exists and is not a socket", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("%w: %s", ErrSocketInUse, path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("uffd listen: remove stale socket %s: %w", path, err)
	}
	return nil
}

// SocketPath is the path VMMs connect to.
func (h *Handler) SocketPath() string { return h.socketPath }

// AcceptOptions describe the VMM one AcceptWith waits for.
type AcceptOptions struct {
	// VMMExited, when set, is closed once the VMM process expected to
	// connect has exited: it can no longer connect, so the wait ends at
	// once with an error wrapping ErrExitedBeforeConnect.
	VMMExited <-chan struct{}
	// ConnectTimeout, when positive, bounds the wait for the connection
	// (the handshake that follows has HandshakeTimeout); the error then
	// wraps ErrConnectTimeout.
	ConnectTimeout time.Duration
}

// Accept waits for a VMM to connect, receives its handshake, validates the
// mappings against the lower file and starts serving its faults. A
// rejected handshake returns an error wrapping ErrBadHandshake; the handler
// keeps listening. ctx bounds both the wait and the handshake.
func (h *Handler) Accept(ctx context.Context) (*Session, error) {
	return h.AcceptWith(ctx, AcceptOptions{})
}

// AcceptWith is Accept for one known VMM: the wait for its connection also
// ends when that VMM exits or the connect timeout passes, since a VMM that
// died before connecting would otherwise leave the caller waiting for ever.
func (h *Handler) AcceptWith(ctx context.Context, opts AcceptOptions) (*Session, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Accepts are serialised so that one call's cancellation deadline
	// never leaks into the next.
	h.acceptMu.Lock()
	defer h.acceptMu.Unlock()
	h.mu.Lock()
	closed := h.closed
	h.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if err := h.ln.SetDeadline(time.Time{}); err != nil {
		if errors.Is(err, net.ErrClosed) {
			return nil, ErrClosed
		}
		return nil, fmt.Errorf("uffd accept: %w", err)
	}
	conn, err := h.acceptConn(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer conn.Close()

	// A VMM sends its handshake as soon as it connects; one that does not
	// must not hold up the handler, nor its Close.
	hctx, cancel := context.WithTimeout(ctx, HandshakeTimeout)
	defer cancel()
	unlink := context.AfterFunc(h.closing, cancel)
	defer unlink()
	stop := interruptOnDone(hctx, conn.SetDeadline)
	mappings, uffd, err := userfaultfd.ReceiveHandshake(conn)
	stop()
	if err != nil {
		switch {
		case h.closing.Err() != nil:
			return nil, ErrClosed
		case hctx.Err() != nil:
			return nil, fmt.Errorf("uffd handshake: %w (%w)", hctx.Err(), err)
		}
		return nil, err
	}
	if err := userfaultfd.ValidateMappings(mappings, h.lower.Size()); err != nil {
		unix.Close(uffd)
		return nil, err
	}
	pidfd, err := peerPidfd(conn)
	if err != nil {
		unix.Close(uffd)
		return nil, fmt.Errorf("uffd handshake: watch VMM process: %w", err)
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		unix.Close(uffd)
		unix.Close(pidfd)
		return nil, ErrClosed
	}
	s, err := newSession(h, mappings, uffd, pidfd)
	if err != nil {
		unix.Close(uffd)
		unix.Close(pidfd)
		return nil, err
	}
	h.sessions[s] = struct{}{}
	go s.serve()
	return s, nil
}

// acceptConn waits for the next connection until ctx ends, the expected
// VMM exits or the connect timeout passes. Each ending has its own error,
// so that an operator learns which one happened.
func (h *Handler) acceptConn(ctx context.Context, opts AcceptOptions) (*net.UnixConn, error) {
	wait, cancel := connectWait(ctx, opts)
	defer cancel()
	conn, err := h.acceptUntil(wait)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(wait), ErrExitedBeforeConnect) && h.connectionPending() {
		// The VMM connected and then died, so it did not exit before
		// connecting. Its handshake is buffered in the socket; the
		// session that takes it reports the exit (ErrVMMExited).
		conn, err = h.acceptUntil(ctx)
	}
	switch {
	case err == nil:
		return conn, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("uffd accept: %w", ctx.Err())
	case wait.Err() != nil:
		return nil, fmt.Errorf("uffd accept on %s: %w", h.socketPath, context.Cause(wait))
	case errors.Is(err, net.ErrClosed):
		return nil, ErrClosed
	}
	return nil, fmt.Errorf("uffd accept: %w", err)
}

// connectWait is ctx ended also by the VMM's exit and by the connect
// timeout, each with its own cause.
func connectWait(ctx context.Context, opts AcceptOptions) (context.Context, context.CancelFunc) {
	wait, cancel := context.WithCancelCause(ctx)
	if opts.VMMExited != nil {
		go func() {
			select {
			case <-opts.VMMExited:
				cancel(ErrExitedBeforeConnect)
			case <-wait.Done():
			}
		}()
	}
	if opts.ConnectTimeout <= 0 {
		return wait, func() { cancel(nil) }
	}
	timed, stop := context.WithTimeoutCause(wait, opts.ConnectTimeout,
		fmt.Errorf("%w within %v", ErrConnectTimeout, opts.ConnectTimeout))
	return timed, func() { stop(); cancel(nil) }
}

// acceptUntil accepts the next connection, giving up once ctx ends.
func (h *Handler) acceptUntil(ctx context.Context) (*net.UnixConn, error) {
	if err := h.ln.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	stop := interruptOnDone(ctx, h.ln.SetDeadline)
	defer stop()
	return h.ln.AcceptUnix()
}

// connectionPending reports whether a connection waits in the listen
// queue. Once a VMM has been reaped every connect it made is queued, so
// this tells whether it connected before it died.
func (h *Handler) connectionPending() bool {
	raw, err := h.ln.SyscallConn()
	if err != nil {
		return false
	}
	pending := false
	raw.Control(func(fd uintptr) {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		pending = err == nil && n > 0
	})
	return pending
}

// interruptOnDone makes blocked I/O on a socket return once ctx is done, by
// moving its deadline into the past. The returned stop waits for a
// concurrent interruption to finish so that it cannot outlive the call.
func interruptOnDone(ctx context.Context, setDeadline func(time.Time) error) (stop func()) {
	fired := make(chan struct{})
	cancel := context.AfterFunc(ctx, func() {
		setDeadline(time.Unix(1, 0))
		close(fired)
	})
	return func() {
		if !cancel() {
			<-fired
		}
	}
}

// forget drops a finished session.
func (h *Handler) forget(s *Session) {
	h.mu.Lock()
	delete(h.sessions, s)
	h.mu.Unlock()
}

// Close stops listening, removes the socket file, closes every session
// (their VMs stall on the next missing page: see the package comment) and
// the lower file.
func (h *Handler) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.markClosing()
	sessions := make([]*Session, 0, len(h.sessions))
	for s := range h.sessions {
		sessions = append(sessions, s)
	}
	h.mu.Unlock()

	errs := []error{h.ln.Close()}
	// Every session is asked to stop first, so that their close bounds
	// run together rather than one after another.
	for _, s := range sessions {
		s.stop()
	}
	var stuck []*Session
	for _, s := range sessions {
		if err := s.waitClosed(); err != nil {
			errs = append(errs, err)
			stuck = append(stuck, s)
		}
	}
	if len(stuck) == 0 {
		errs = append(errs, h.lower.Close())
	} else {
		// Closing a file a read is blocked in can wait for that read
		// (a pollable one, such as a FUSE file): the lower is closed
		// once the sessions left in their reads have returned.
		go func() {
			for _, s := range stuck {
				<-s.done
			}
			h.lower.Close()
		}()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("uffd handler close: %w", err)
	}
	return nil
}

// soPeerPidfd is SO_PEERPIDFD (Linux 6.5, asm-generic/socket.h), not yet in
// golang.org/x/sys.
const soPeerPidfd = 77

// peerPidfd returns a pidfd for the VMM at the other end of conn; it becomes
// readable when the VMM exits. The VMM's exit is invisible on the
// userfaultfd itself, which never reports POLLHUP. SO_PEERPIDFD pins the
// very process that connected; older kernels fall back to the connecting
// PID, which could only be wrong if that process exited and its PID was
// reused before this call.
func peerPidfd(conn *net.UnixConn) (int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return -1, err
	}
	pidfd := -1
	var perr error
	err = raw.Control(func(fd uintptr) {
		pidfd, perr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, soPeerPidfd)
		if perr == nil {
			return
		}
		cred, cerr := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if cerr != nil {
			perr = fmt.Errorf("peer credentials: %w", cerr)
			return
		}
		if cred.Pid <= 0 {
			perr = fmt.Errorf("peer process not visible in this PID namespace")
			return
		}
		pidfd, perr = unix.PidfdOpen(int(cred.Pid), 0)
		if perr != nil {
			perr = fmt.Errorf("pidfd_open %d: %w", cred.Pid, perr)
		}
	})
	if err != nil {
		return -1, err
	}
	return pidfd, perr
}
