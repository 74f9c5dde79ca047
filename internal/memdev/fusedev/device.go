package fusedev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"warmstart/internal/memdev"
)

// I/O engines are memdev's (memdev.IOEngine*): the buffered ones open
// device files with FOPEN_KEEP_CACHE, memdev.IOEngineDirect with
// FOPEN_DIRECT_IO.

// maxNameBytes is the longest file name Linux accepts.
const maxNameBytes = 255

// generation is one attached memory, shared by every reference to its key.
type generation struct {
	srv    *Server
	key    string
	name   string
	number uint64
	// mem is what the generation reads: the request's memory, checked
	// and bound to scope (memdev.Memory); ref is its Source's Ref.
	mem      *memdev.Memory
	scope    *memdev.ReadScope
	ref      string
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
	// missFill fills around demand misses (missfill.go); nil on a mount
	// without Options.MissFillBytes.
	missFill *missFill
	passthroughState
	// overlay holds a writable view's written pages; nil for a read-only
	// generation (view.go).
	overlay *overlay

	refs int // guarded by srv.mu

	mu       sync.Mutex // guards detached and Add on inflight
	detached bool
	inflight sync.WaitGroup
	drained  chan struct{}

	lowerOnce sync.Once
}

// Device is one reference to a device generation, as returned by Attach
// and Share. References to the same generation share its file, counters
// and trace. It implements memdev.Device and the optional interfaces the
// file device can: Tracer, ReadEnder, CorruptionReporter, Sharer, Mapped
// and ObserverRemover.
type Device struct {
	gen *generation

	// joined: this reference counts in the generation's read scope (an
	// attach does, a Share does not), until EndReads.
	joined  bool
	endOnce sync.Once
	ended   bool
	// unobserve drops the attach's observer (StopObserving).
	unobserve func()
	obsOnce   sync.Once

	releaseOnce sync.Once
	ack         <-chan struct{}
	last        bool // the release dropped the generation's last reference
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

// Release implements memdev.Device: it drops this reference (leaving the
// read scope and dropping the observer first, if this reference had not).
// When it is the generation's last, the file is detached at once (new
// opens fail with ENOENT, reads through files still open fail with EIO),
// and Release waits until every read the generation had in flight has
// returned and the lower is closed; last then reports that the generation
// is gone, and what was keyed by its number (prefetch tasks) can go too.
// Calling it again waits for the same release.
func (d *Device) Release(ctx context.Context) (last bool, err error) {
	select {
	case <-d.release():
		return d.last, nil
	case <-ctx.Done():
		return false, fmt.Errorf("wait for memory device release: %w", ctx.Err())
	}
}

// release drops the reference once and returns the channel that closes
// with the acknowledgement.
func (d *Device) release() <-chan struct{} {
	d.releaseOnce.Do(func() {
		d.StopObserving()
		d.EndReads(errReleased)
		d.ack, d.last = d.gen.srv.release(d.gen)
	})
	return d.ack
}

// errReleased ends the reads of a reference released without EndReads.
var errReleased = fmt.Errorf("memory device released: %w", context.Canceled)

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
	g.lowerOnce.Do(func() {
		g.mem.Close()
		if g.overlay != nil {
			g.overlay.close()
		}
	})
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
	g.notePassthroughRead()
	g.readAroundLower(kind, off)
	n, err = g.mem.ReadAt(dest[:want], off)
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
	if g.overlay != nil {
		if err := g.overlay.patch(dest[:n], off); err != nil {
			return nil, syscall.EIO
		}
	}
	g.served.mark(off, int64(n))
	if !g.observers.empty() {
		g.observers.served(kind, off, n, time.Since(began))
	}
	g.fillAroundMiss(kind, off, n)
	return dest[:n], 0
}

// ino is the generation's inode number: generations are numbered from 1,
// and inode 1 is the root directory.
func (g *generation) ino() uint64 { return g.number + 1 }

func (g *generation) fillAttr(out *fuse.Attr) {
	out.Ino = g.ino()
	out.Mode = syscall.S_IFREG | 0o444
	if g.overlay != nil {
		out.Mode = syscall.S_IFREG | 0o644
	}
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
	_ = (fs.NodeFsyncer)((*fileNode)(nil))
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
	if f.gen.ioEngine == memdev.IOEngineDirect {
		return nil, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
	}
	h, errno := f.gen.passthroughOpen()
	if errno != 0 {
		return nil, 0, errno
	}
	if h != nil {
		// go-fuse adds FOPEN_PASSTHROUGH and drops KEEP_CACHE.
		return h, fuse.FOPEN_NOFLUSH, 0
	}
	return nil, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
}

// Write stores a writable view's written-back pages in its overlay; every
// other device file is read-only.
func (f *fileNode) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if f.gen.overlay == nil {
		return 0, syscall.EROFS
	}
	if !f.gen.beginRead() {
		return 0, syscall.EIO
	}
	defer f.gen.inflight.Done()
	if errno := f.gen.overlay.write(data, off); errno != 0 {
		return 0, errno
	}
	return uint32(len(data)), 0
}

// Setattr refuses every change but a writable view's times, which the
// kernel may set on a write; a size never changes.
func (f *fileNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetSize(); ok || f.gen.overlay == nil {
		return syscall.EROFS
	}
	f.gen.fillAttr(&out.Attr)
	return 0
}

// Fsync has nothing to make durable: a view's overlay is the restore's
// scratch, and other files are never written. Answering it lets a caller's
// fsync wait for the kernel's write-back of a shared mapping.
func (f *fileNode) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno { return 0 }

// lowerReadaroundBytes is how much of a lower a demand read on
// a mount with a narrower readaround window asks storage for around it.
const lowerReadaroundBytes = DefaultReadAheadBytes

// readAroundLower, for a guest's read on a mount whose readaround window is
// narrower than lowerReadaroundBytes (the prefetching mount's one page),
// tells the kernel that the lower file's bytes around off will be read
// soon (POSIX_FADV_WILLNEED): one storage read then brings in the
// neighbours a guest missing a page tends to fault next, as the wide
// window would, while each of its faults still reaches the device as the
// one page it touched, which is what the accounting and the learned
// manifest need. It changes no byte anyone reads; lowers that cannot be
// advised (memdev.Advisor), and failures, are ignored.
func (g *generation) readAroundLower(kind memdev.Kind, off int64) {
	if g.srv.readAheadBytes >= lowerReadaroundBytes || kind != memdev.Demand || !g.mem.Advisable() {
		return
	}
	start := max(0, off-lowerReadaroundBytes/2) &^ (fillPageBytes - 1)
	_ = g.mem.Advise(start, lowerReadaroundBytes)
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
