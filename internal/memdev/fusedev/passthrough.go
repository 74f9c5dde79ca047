package fusedev

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"warmstart/internal/memdev"
)

// passthroughHandle is the file handle of a passthrough open: go-fuse
// registers its descriptor with the kernel (FUSE_DEV_IOC_BACKING_OPEN) and
// answers the open with FOPEN_PASSTHROUGH, after which the kernel serves
// reads and mappings of the device file from the lower file's own page
// cache. go-fuse keeps one registration per inode, and the kernel its
// own reference to the file. The handle owns a duplicate of the lower's
// descriptor, closed when the kernel releases the open: the generation
// may close the lower itself meanwhile.
type passthroughHandle struct{ fd int }

func (h *passthroughHandle) PassthroughFd() (int, bool) { return h.fd, true }

// Release implements fs.FileReleaser.
func (h *passthroughHandle) Release(context.Context) syscall.Errno {
	if err := unix.Close(h.fd); err != nil {
		return fs.ToErrno(err)
	}
	return 0
}

// passthroughOpen is the handle of a passthrough open of g's file, nil
// when g does not serve in that mode; errno when g was released.
func (g *generation) passthroughOpen() (*passthroughHandle, syscall.Errno) {
	lower, ok := g.passthroughFile()
	if !ok {
		return nil, 0
	}
	// As a read: a release waits for it, and closes the lower only after.
	if !g.beginRead() {
		return nil, syscall.ENOENT
	}
	defer g.inflight.Done()
	rc, err := lower.SyscallConn()
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	fd := -1
	if cerr := rc.Control(func(f uintptr) { fd, err = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); cerr != nil {
		return nil, fs.ToErrno(cerr)
	}
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return &passthroughHandle{fd: fd}, 0
}

// passthroughFile is the lower file a passthrough open of g hands the
// kernel, when g serves one in that mode. A writable view never does: the
// kernel would send the guest's written-back pages to the lower file, not
// to the view's overlay.
func (g *generation) passthroughFile() (*os.File, bool) {
	if !g.srv.opts.Passthrough || g.ioEngine == memdev.IOEngineDirect || g.overlay != nil {
		return nil, false
	}
	return g.mem.LocalFile()
}

// passthrough reports whether g's opens are passthrough opens and no read
// reached the device since: a kernel or go-fuse that refused passthrough
// (go-fuse then stops asking for the whole mount) sends reads instead.
func (g *generation) passthrough() bool {
	_, ok := g.passthroughFile()
	return ok && !g.passthroughRefused.Load()
}

// notePassthroughRead notes a read request on a generation whose opens
// ask for passthrough: the kernel did not grant it.
func (g *generation) notePassthroughRead() {
	if _, ok := g.passthroughFile(); ok && g.passthroughRefused.CompareAndSwap(false, true) && g.srv.opts.Log != nil {
		g.srv.opts.Log.Warn("FUSE passthrough not in effect: the kernel sent a read; memory is served and checked by the device",
			"file", g.name)
	}
}

// Passthrough implements memdev.Passthrougher.
func (d *Device) Passthrough() bool { return d.gen.passthrough() }

// readaheadLower is Fill on a passthrough generation: the kernel reads
// [off, off+n) of the lower file into its page cache, which the guest's
// mapping reads; nothing is copied and nothing checked. The range counts
// as prefetched for the observers, not as a device read.
func (g *generation) readaheadLower(f *os.File, off, n int64) error {
	if !g.beginRead() {
		return fmt.Errorf("fill %s: %w", g.name, syscall.EIO)
	}
	defer g.inflight.Done()
	n = min(n, g.size-off)
	began := time.Now()
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("fill %s: %w", g.name, err)
	}
	// Heard of before the readahead, as a fill is before its store: the
	// readahead puts the pages in the lower's page cache, where the
	// guest's mapping finds them without a request, and a restore that
	// reaches ready then must count them as brought in, not unused. A
	// readahead refused after this leaves the event (as a refused store
	// does): the guest then reads those pages through the kernel on demand.
	g.observers.served(memdev.Prefetch, off, int(n), time.Since(began))
	var rerr error
	if err := rc.Control(func(fd uintptr) {
		if _, _, e := unix.Syscall(unix.SYS_READAHEAD, fd, uintptr(off), uintptr(n)); e != 0 {
			rerr = e
		}
	}); err != nil {
		return fmt.Errorf("fill %s: %w", g.name, err)
	}
	if rerr != nil {
		return fmt.Errorf("fill %s [%d, %d): readahead of the lower file: %w", g.name, off, off+n, rerr)
	}
	return nil
}

// passthroughState is the generation's record of passthrough refused.
type passthroughState struct{ passthroughRefused atomic.Bool }
