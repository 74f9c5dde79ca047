package fusedev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"warmstart/internal/config"
	"warmstart/internal/fsx"
	"warmstart/internal/memdev"
)

// I/O engines are config's (config.IOEngine*): the buffered ones open
// device files with FOPEN_KEEP_CACHE, config.IOEngineDirect with
// FOPEN_DIRECT_IO.

// maxNameBytes is the longest file name Linux accepts.
const maxNameBytes = 255

// generation is one attached lower file, shared by every reference to its key.
type generation struct {
	srv      *Server
	key      string
	name     string
	number   uint64
	lower    lowerFile
	lowerRef string
	size     int64
	mtime    uint64
	ioEngine int

	counters  memdev.CounterSet
	trace     tracer
	observers observerSet
	corrupt   corruption
	// served marks the pages this generation has handed to the kernel (by
	// read or fill). KEEP_CACHE keeps them cached for the generation's life
	// unless memory pressure reclaims them, so a fill can skip them.
	served pageSet

	refs int // guarded by srv.mu

	mu       sync.Mutex // guards detached and Add on inflight
	detached bool
	inflight sync.WaitGroup
	drained  chan struct{}

	lowerOnce sync.Once
}

// Device is one reference to a device generation, as returned by Attach.
// References to the same generation share its file, counters and trace.
type Device struct {
	gen *generation

	releaseOnce sync.Once
	ack         <-chan struct{}
	last        bool // the release dropped the generation's last reference
}

// Attach returns a reference to the device generation of key, creating a
// new generation serving lowerPath if key has none. key identifies the
// snapshot and becomes part of the device file's name. A second attach of
// an attached key must name the same lower file and io_engine.
func (s *Server) Attach(key, lowerPath string, ioEngine int) (*Device, error) {
	return s.AttachVerified(key, lowerPath, ioEngine, nil)
}

// AttachVerified is Attach with every block read from the lower file
// checked by v before it is served; a nil v checks nothing. Attaches of one
// key must agree on whether they verify.
func (s *Server) AttachVerified(key, lowerPath string, ioEngine int, v *Verifier) (*Device, error) {
	if err := validKey(key); err != nil {
		return nil, fmt.Errorf("attach %q: %w", key, err)
	}
	if !config.ValidIOEngine(ioEngine) {
		return nil, fmt.Errorf("attach %q: %w: %d", key, ErrInvalidIOEngine, ioEngine)
	}
	path, err := filepath.Abs(lowerPath)
	if err != nil {
		return nil, fmt.Errorf("attach %q: %w", key, err)
	}
	lowerRef := path

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("attach %q: %w", key, ErrClosed)
	}
	if g, ok := s.byKey[key]; ok {
		defer s.mu.Unlock()
		return g.share(lowerRef, ioEngine, v != nil)
	}
	s.mu.Unlock()

	// Open outside the lock: the lower file may sit on slow storage.
	f, err := fsx.OpenRegular(path)
	if err != nil {
		return nil, fmt.Errorf("attach %q: open lower file: %w", key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("attach %q: stat lower file: %w", key, err)
	}
	if fi.Size() <= 0 {
		f.Close()
		return nil, fmt.Errorf("attach %q: lower file %s is empty", key, path)
	}
	lower, err := wrapFile(f, fi.Size(), v)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("attach %q: %s: %w", key, path, err)
	}
	return s.install(key, lower, lowerRef, fi.Size(), fi.ModTime(), ioEngine)
}

// Hold returns another reference to generation gen of key, which some
// holder still has attached. It joins what a restore attached without
// naming the lower again: a remote lower (AttachLower) has no local path
// for Attach to compare, and the restore's reference proves the lower.
func (s *Server) Hold(key string, gen uint64) (*Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("hold %q: %w", key, ErrClosed)
	}
	g, ok := s.byKey[key]
	if !ok || g.number != gen {
		return nil, fmt.Errorf("hold %q generation %d: %w", key, gen, ErrNotAttached)
	}
	g.refs++
	return &Device{gen: g}, nil
}

// install makes a new generation of key serving lower, which was opened
// outside the server's lock, unless the server closed or another attach of
// key won the race meanwhile: then lower is closed, and the winner shared.
func (s *Server) install(key string, lower lowerFile, lowerRef string, size int64, mtime time.Time, ioEngine int) (*Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		lower.Close()
		return nil, fmt.Errorf("attach %q: %w", key, ErrClosed)
	}
	if g, ok := s.byKey[key]; ok {
		verify := isVerified(lower)
		lower.Close()
		return g.share(lowerRef, ioEngine, verify)
	}
	return &Device{gen: s.newGenerationLocked(key, lower, lowerRef, size, mtime, ioEngine)}, nil
}

// share adds a reference to g for an attach of its key; s.mu is held.
func (g *generation) share(lowerRef string, ioEngine int, verify bool) (*Device, error) {
	if g.lowerRef != lowerRef || g.ioEngine != ioEngine {
		return nil, fmt.Errorf("attach %q: %w: generation %d serves %s with io_engine %d, not %s with %d",
			g.key, ErrAttachConflict, g.number, g.lowerRef, g.ioEngine, lowerRef, ioEngine)
	}
	if verify && !g.verified() {
		// An attach that asks for checked bytes never shares a generation
		// that serves unchecked ones; the reverse is harmless.
		return nil, fmt.Errorf("attach %q: %w: generation %d serves %s unverified",
			g.key, ErrAttachConflict, g.number, g.lowerRef)
	}
	g.refs++
	return &Device{gen: g}, nil
}

func validKey(key string) error {
	switch {
	case key == "" || key == "." || key == "..":
		return fmt.Errorf("%w: empty or a dot name", ErrInvalidKey)
	case strings.ContainsAny(key, "/\x00"):
		return fmt.Errorf("%w: contains '/' or NUL", ErrInvalidKey)
	case len(key) > maxNameBytes-32:
		return fmt.Errorf("%w: longer than %d bytes", ErrInvalidKey, maxNameBytes-32)
	}
	return nil
}

// Path is the device file the VMM maps and the prefetcher reads.
func (d *Device) Path() string { return filepath.Join(d.gen.srv.dir, d.gen.name) }

// Generation is the generation number, unique in the process and increasing.
func (d *Device) Generation() uint64 { return d.gen.number }

// Size is the device file's size: the lower file's size at attach.
func (d *Device) Size() int64 { return d.gen.size }

// IOEngine is the io_engine the generation was attached with.
func (d *Device) IOEngine() int { return d.gen.ioEngine }

// Counters returns the generation's counters.
func (d *Device) Counters() memdev.Counters { return d.gen.counters.Load() }

// StartTrace (re)starts access tracing of the generation with an empty trace.
func (d *Device) StartTrace() { d.gen.trace.start(d.gen.size) }

// Trace returns the first touches recorded so far, in order.
func (d *Device) Trace() []memdev.Touch { return d.gen.trace.snapshot() }

// StopTrace stops tracing and returns the recorded first touches.
func (d *Device) StopTrace() []memdev.Touch { return d.gen.trace.stop() }

// Release drops this reference. When it is the generation's last, the file
// is detached at once (new opens fail with ENOENT, reads through files
// still open fail with EIO) and the returned channel closes once every read
// the generation had in flight has returned and the lower file is closed.
// For any other reference the channel is already closed. Calling Release
// again returns the same channel.
func (d *Device) Release() <-chan struct{} {
	d.releaseOnce.Do(func() { d.ack, d.last = d.gen.srv.release(d.gen) })
	return d.ack
}

// ReleasedLast reports, after Release, whether that release dropped the
// generation's last reference: once its channel closes the generation is
// gone, and what was keyed by its number (prefetch tasks) can go too.
func (d *Device) ReleasedLast() bool {
	d.Release()
	return d.last
}

func (s *Server) release(g *generation) (<-chan struct{}, bool) {
	s.mu.Lock()
	g.refs--
	last := g.refs == 0
	if last {
		delete(s.byKey, g.key)
		delete(s.byName, g.name)
	}
	s.mu.Unlock()
	if !last {
		done := make(chan struct{})
		close(done)
		return done, false
	}

	g.mu.Lock()
	g.detached = true
	g.mu.Unlock()
	go func() {
		g.inflight.Wait()
		g.closeLower()
		close(g.drained)
	}()
	// Drop the kernel's cached name so the inode, and its page cache, go
	// away once no process holds the file. Failure only delays that.
	s.root.EmbeddedInode().NotifyEntry(g.name)
	return g.drained, true
}

func (g *generation) closeLower() {
	g.lowerOnce.Do(func() { g.lower.Close() })
}

// beginRead admits a read unless the generation is detached. Reads admitted
// here are what Release waits for.
func (g *generation) beginRead() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.detached {
		return false
	}
	g.inflight.Add(1)
	return true
}

// read serves one FUSE read request of [off, off+len(dest)).
func (g *generation) read(ctx context.Context, dest []byte, off int64) ([]byte, syscall.Errno) {
	if off < 0 {
		return nil, syscall.EINVAL
	}
	if !g.beginRead() {
		return nil, syscall.EIO
	}
	defer g.inflight.Done()
	if off >= g.size {
		return nil, 0
	}
	want := int(min(int64(len(dest)), g.size-off))
	g.trace.record(off, want)
	began := time.Now()
	g.counters.Begin(want)
	n := 0
	err := errors.New("read handler did not return")
	defer func() { g.counters.End(want, n, err) }()
	if hook := g.srv.opts.ReadHook; hook != nil {
		hook(g.number, off, want)
	}
	kind := requestKind(ctx)
	g.readAroundLower(kind, off)
	n, err = g.lower.ReadAt(dest[:want], off)
	switch {
	case n == want:
		err = nil // ReadAt reports io.EOF for a read ending at EOF
	case err == nil:
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		g.corrupt.note(err)
		// Short within the device size means the lower file shrank under
		// us; either way the reader must not see made-up bytes.
		return nil, syscall.EIO
	}
	g.served.mark(off, int64(n))
	if !g.observers.empty() {
		g.observers.served(kind, off, n, time.Since(began))
	}
	return dest[:n], 0
}

// ino is the generation's inode number: generations are numbered from 1,
// and inode 1 is the root directory.
func (g *generation) ino() uint64 { return g.number + 1 }

func (g *generation) fillAttr(out *fuse.Attr) {
	out.Ino = g.ino()
	out.Mode = syscall.S_IFREG | 0o444
	out.Nlink = 1
	out.Size = uint64(g.size)
	out.Blocks = (uint64(g.size) + 511) / 512
	out.Blksize = 4096
	out.Mtime, out.Ctime, out.Atime = g.mtime, g.mtime, g.mtime
}

// rootNode is the mount's directory: it lists the attached generations.
type rootNode struct {
	fs.Inode
	srv *Server
}

var (
	_ = (fs.NodeLookuper)((*rootNode)(nil))
	_ = (fs.NodeReaddirer)((*rootNode)(nil))
	_ = (fs.NodeOpener)((*fileNode)(nil))
	_ = (fs.NodeReader)((*fileNode)(nil))
	_ = (fs.NodeGetattrer)((*fileNode)(nil))
	_ = (fs.NodeWriter)((*fileNode)(nil))
	_ = (fs.NodeSetattrer)((*fileNode)(nil))
)

func (r *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	r.srv.mu.Lock()
	g, ok := r.srv.byName[name]
	r.srv.mu.Unlock()
	if !ok {
		return nil, syscall.ENOENT
	}
	g.fillAttr(&out.Attr)
	// A new generation is a new inode, with its own page cache.
	return r.NewInode(ctx, &fileNode{gen: g}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: g.ino()}), 0
}

func (r *rootNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	r.srv.mu.Lock()
	entries := make([]fuse.DirEntry, 0, len(r.srv.byName))
	for name, g := range r.srv.byName {
		entries = append(entries, fuse.DirEntry{Name: name, Mode: syscall.S_IFREG, Ino: g.ino()})
	}
	r.srv.mu.Unlock()
	return fs.NewListDirStream(entries), 0
}

// fileNode is one generation's device file.
type fileNode struct {
	fs.Inode
	gen *generation
}

func (f *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 || (flags&syscall.O_ACCMODE != syscall.O_RDONLY && !f.gen.srv.opts.AllowWriteOpen) {
		return nil, 0, syscall.EROFS
	}
	f.gen.mu.Lock()
	detached := f.gen.detached
	f.gen.mu.Unlock()
	if detached {
		return nil, 0, syscall.ENOENT
	}
	// FOPEN_NOFLUSH: closing a device file sends no FLUSH, which has nothing
	// to do on a read-only file. This process holds device files of its own
	// open (a prefetch's, a fill's): when it dies, the kernel closes its files
	// in descriptor order, and a FLUSH for one closed before the process's
	// /dev/fuse descriptor would wait for an answer from a server that is
	// gone, leaving the process unkillable (TestServerExitsWithItsOwnFileOpen).
	// The RELEASE a close still sends does not wait.
	if f.gen.ioEngine == config.IOEngineDirect {
		return nil, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
	}
	return nil, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
}

func (f *fileNode) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	return 0, syscall.EROFS
}

func (f *fileNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return syscall.EROFS
}

// lowerReadaroundBytes is how much of a local lower file a demand read on
// a mount with a narrower readaround window asks storage for around it.
const lowerReadaroundBytes = DefaultReadAheadBytes

// readAroundLower, for a guest's read on a mount whose readaround window is
// narrower than lowerReadaroundBytes (the prefetching mount's one page),
// tells the kernel that the lower file's bytes around off will be read
// soon (POSIX_FADV_WILLNEED): one storage read then brings in the
// neighbours a guest missing a page tends to fault next, as the wide
// window would, while each of its faults still reaches the device as the
// one page it touched, which is what the accounting and the learned
// manifest need. It changes no byte anyone reads; lowers that are not
// local files, and failures, are ignored.
func (g *generation) readAroundLower(kind memdev.Kind, off int64) {
	if g.srv.readAheadBytes >= lowerReadaroundBytes || kind != memdev.Demand {
		return
	}
	f, ok := g.lower.(interface{ Fd() uintptr })
	if !ok {
		return
	}
	start := max(0, off-lowerReadaroundBytes/2) &^ (fillPageBytes - 1)
	_ = unix.Fadvise(int(f.Fd()), start, lowerReadaroundBytes, unix.FADV_WILLNEED)
}

func (f *fileNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.gen.fillAttr(&out.Attr)
	return 0
}

func (f *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	data, errno := f.gen.read(ctx, dest, off)
	if errno != 0 {
		return nil, errno
	}
	return fuse.ReadResultData(data), 0
}
