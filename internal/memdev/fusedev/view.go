package fusedev

import (
	"errors"
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

// DefaultOverlayPendingBytes bounds the written pages a view holds in
// memory while its overlay's file system refuses them (full, or over
// quota): enough for a guest's writes over the minutes an operator needs
// to free space, small beside the guest's own memory.
const DefaultOverlayPendingBytes = 64 << 20

// overlay holds the pages written to a view.
//
// A page the kernel writes back is the guest's only copy once the page
// cache drops it: a write the file cannot take (its file system full) is
// held in memory (pending) and stored at the next freeze, so neither a
// later read nor a child loses it. Past maxPending bytes a page is lost:
// its write fails, a read of it fails rather than serve older bytes, and
// every freeze fails until the guest writes it again.
type overlay struct {
	mu   sync.Mutex
	file *os.File
	size int64
	// written marks every page ever written (reads come from the file,
	// or pending); since marks those written since the last freeze.
	written pageSet
	since   pageSet
	// pending holds, by page number, the pages the file refused.
	pending    map[int64][]byte
	maxPending int64
	// lost marks the pages neither the file nor pending took, and
	// lostErr is why the file refused the last of them.
	lost    map[int64]bool
	lostErr error
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
	return &overlay{file: f, size: size, written: newPageSet(size), since: newPageSet(size),
		pending: map[int64][]byte{}, maxPending: DefaultOverlayPendingBytes, lost: map[int64]bool{}}, nil
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
	o.written.mark(off, n)
	o.since.mark(off, n)
	if _, err := o.file.WriteAt(data, off); err != nil {
		return o.hold(data, off, err)
	}
	for p := off / fillPageBytes; p < (off+n)/fillPageBytes; p++ {
		delete(o.pending, p)
		delete(o.lost, p)
	}
	return 0
}

// hold keeps in pending the pages of data, which the file refused with
// err, as far as maxPending allows; the rest are lost, and their write
// fails with err's errno (ENOSPC for a full file system).
func (o *overlay) hold(data []byte, off int64, err error) syscall.Errno {
	var errno syscall.Errno
	for i := int64(0); i < int64(len(data)); i += fillPageBytes {
		p := (off + i) / fillPageBytes
		if _, held := o.pending[p]; !held && int64(len(o.pending)+1)*fillPageBytes > o.maxPending {
			o.lost[p], o.lostErr = true, err
			errno = syscall.EIO
			if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
				errno = syscall.ENOSPC
			}
			continue
		}
		o.pending[p] = append(o.pending[p][:0], data[i:i+fillPageBytes]...)
		delete(o.lost, p)
	}
	return errno
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
		if o.lost[p] {
			return fmt.Errorf("overlay page %d: its write was refused (%w) and it could not be held in memory", p, o.lostErr)
		}
		lo, hi := max(off, p*fillPageBytes), min(end, (p+1)*fillPageBytes)
		if held, ok := o.pending[p]; ok {
			copy(dest[lo-off:hi-off], held[lo-p*fillPageBytes:hi-p*fillPageBytes])
			continue
		}
		if _, err := o.file.ReadAt(dest[lo-off:hi-off], lo); err != nil {
			return fmt.Errorf("read overlay page %d: %w", p, err)
		}
	}
	return nil
}

// store writes the pending pages to the file, forgetting each stored; it
// fails while a page is lost or the file still refuses one.
func (o *overlay) store() error {
	if len(o.lost) > 0 {
		return fmt.Errorf("%d written pages could not be kept: their write was refused (%w) with %d MiB already held in memory; the guest must write them again",
			len(o.lost), o.lostErr, o.maxPending>>20)
	}
	for p, data := range o.pending {
		if _, err := o.file.WriteAt(data, p*fillPageBytes); err != nil {
			return fmt.Errorf("store %d written pages held in memory in the overlay: %w", len(o.pending), err)
		}
		delete(o.pending, p)
	}
	return nil
}

// freeze copies the pages written since the last freeze to a new sparse
// file at path and forgets them.
func (o *overlay) freeze(path string) ([]int64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.store(); err != nil {
		return nil, fmt.Errorf("freeze written pages: %w", err)
	}
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
