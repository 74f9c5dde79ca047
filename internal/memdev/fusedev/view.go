package fusedev

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// A writable view (memdev.Request.Writable) is a generation of its own, so
// no other VM shares its file or page cache, whose writes go to an overlay:
// a sparse file in the restore's run directory. The VMM maps it shared; the
// kernel writes the pages the guest dirtied back as FUSE WRITEs. A read
// serves written pages from the overlay and the rest from the memory, so a
// written page evicted from the page cache comes back as written. The
// memory itself is never written: the one exception to "device files are
// never written" is a view's overlay, which is its restore's alone.

// OverlayFileName is the view's overlay in the restore's run directory.
const OverlayFileName = "memory.overlay"

// viewNumber makes each view's key unique.
var viewNumber atomic.Uint64

// overlay holds the pages written to a view.
type overlay struct {
	mu   sync.Mutex
	file *os.File
	size int64
	// written marks every page ever written (reads come from the file);
	// since marks those written since the last freeze.
	written pageSet
	since   pageSet
}

func newOverlay(dir string, size int64) (*overlay, error) {
	if dir == "" {
		return nil, fmt.Errorf("writable view: no run directory for its overlay")
	}
	f, err := os.OpenFile(filepath.Join(dir, OverlayFileName), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("writable view: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("writable view: size overlay: %w", err)
	}
	return &overlay{file: f, size: size, written: newPageSet(size), since: newPageSet(size)}, nil
}

// write stores whole pages; the kernel writes a shared mapping back in
// pages, so anything else is refused rather than half stored.
func (o *overlay) write(data []byte, off int64) syscall.Errno {
	n := int64(len(data))
	if off < 0 || off%fillPageBytes != 0 || n%fillPageBytes != 0 || off+n > o.size {
		return syscall.EINVAL
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, err := o.file.WriteAt(data, off); err != nil {
		return syscall.EIO
	}
	o.written.mark(off, n)
	o.since.mark(off, n)
	return 0
}

// patch overwrites the written pages of dest (the memory's bytes at off)
// with the overlay's.
func (o *overlay) patch(dest []byte, off int64) error {
	end := off + int64(len(dest))
	o.mu.Lock()
	defer o.mu.Unlock()
	for p := off / fillPageBytes; p*fillPageBytes < end; p++ {
		if !o.written.test(p) {
			continue
		}
		lo, hi := max(off, p*fillPageBytes), min(end, (p+1)*fillPageBytes)
		if _, err := o.file.ReadAt(dest[lo-off:hi-off], lo); err != nil {
			return fmt.Errorf("read overlay page %d: %w", p, err)
		}
	}
	return nil
}

// freeze copies the pages written since the last freeze to a new sparse
// file at path and forgets them.
func (o *overlay) freeze(path string) ([]int64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	dst, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("freeze written pages: %w", err)
	}
	defer dst.Close()
	if err := dst.Truncate(o.size); err != nil {
		return nil, fmt.Errorf("freeze written pages: %w", err)
	}
	var pages []int64
	var copyErr error
	buf := make([]byte, 1<<20)
	o.since.runs(o.size, func(off, n int64) {
		for p := off / fillPageBytes; p < (off+n)/fillPageBytes; p++ {
			pages = append(pages, p)
		}
		for done := int64(0); done < n && copyErr == nil; {
			chunk := buf[:min(int64(len(buf)), n-done)]
			if _, err := o.file.ReadAt(chunk, off+done); err != nil {
				copyErr = err
			} else if _, err := dst.WriteAt(chunk, off+done); err != nil {
				copyErr = err
			}
			done += int64(len(chunk))
		}
	})
	if copyErr != nil {
		return nil, fmt.Errorf("freeze written pages: %w", copyErr)
	}
	if err := dst.Sync(); err != nil {
		return nil, fmt.Errorf("freeze written pages: %w", err)
	}
	o.since = newPageSet(o.size)
	return pages, nil
}

// close is safe on a nil overlay (a read-only generation).
func (o *overlay) close() {
	if o != nil {
		o.file.Close()
	}
}

// FreezeWritten implements memdev.WriteTracker.
func (d *Device) FreezeWritten(path string) ([]int64, error) {
	if d.gen.overlay == nil {
		return nil, fmt.Errorf("freeze %s: not a writable view", d.gen.name)
	}
	return d.gen.overlay.freeze(path)
}

// Flush implements memdev.WriteTracker: an fsync of the view's file makes
// the kernel write back the pages the VMM dirtied through its shared
// mapping (this process serves those WRITEs on other threads; it never
// touches the mapped memory itself).
func (d *Device) Flush() error {
	if d.gen.overlay == nil {
		return fmt.Errorf("flush %s: not a writable view", d.gen.name)
	}
	f, err := os.Open(d.Path())
	if err != nil {
		return fmt.Errorf("flush %s: %w", d.gen.name, err)
	}
	defer f.Close()
	if err := unix.Fsync(int(f.Fd())); err != nil {
		return fmt.Errorf("flush %s: %w", d.gen.name, err)
	}
	return nil
}
