package fusedev

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"syscall"
	"time"

	"warmstart/internal/memdev"
)

// ErrNotCached rejects a Fill the kernel cannot take: the device file uses
// direct I/O (no page cache to fill), or no process has looked it up yet
// (the kernel has no inode to store into).
var ErrNotCached = errors.New("device file has no kernel page cache to fill")

// fillPageBytes is the granularity of the served-page set.
const fillPageBytes = 4096

// Fill brings [off, off+len(buf)) of the device into the kernel page cache
// of the device file (FUSE_NOTIFY_STORE), where the VMM's faults on its
// MAP_PRIVATE mapping find it: it reads each run of pages the device has
// not yet served from the lower file into buf and stores it.
//
// It is the device-side form of prefetch. A buffered read through the
// device file gets the same pages cached, but the kernel cuts such a read
// into requests no larger than the readahead window, so a 1 MiB read costs
// eight round trips through the server, and it copies pages a racing fault
// already brought in; a fill is one lower-file read and one store per run
// of missing pages, however large. Fills count as device reads in the
// generation's counters and are not touches (they never appear in a trace).
//
// Release waits for fills in flight as for reads. The caller must keep the
// device file open while filling, so the kernel keeps its inode.
func (d *Device) Fill(off int64, buf []byte) error {
	g := d.gen
	if g.ioEngine == memdev.IOEngineDirect {
		return fmt.Errorf("fill %s: %w: io_engine 2", g.name, ErrNotCached)
	}
	if off < 0 || off >= g.size {
		return fmt.Errorf("fill %s at %d: outside the device (size %d)", g.name, off, g.size)
	}
	if lower, ok := g.passthroughFile(); ok && !g.passthroughRefused.Load() {
		return g.readaheadLower(lower, off, int64(len(buf)))
	}
	return g.fill(off, buf)
}

// fill is Fill without the checks of its arguments. A writable view is
// never filled: its page cache holds the guest's writes, and a store
// between the check of the served pages and the store itself would put
// the published bytes back over a page the guest faulted in and wrote
// meanwhile.
func (g *generation) fill(off int64, buf []byte) error {
	if g.overlay != nil {
		return fmt.Errorf("fill %s: %w: a writable view's cache holds the guest's writes", g.name, ErrNotCached)
	}
	inode := g.srv.root.GetChild(g.name)
	if inode == nil {
		return fmt.Errorf("fill %s: %w: the file was never looked up", g.name, ErrNotCached)
	}
	if !g.beginRead() {
		return fmt.Errorf("fill %s: %w", g.name, syscall.EIO)
	}
	defer g.inflight.Done()
	end := min(off+int64(len(buf)), g.size)
	for lo := off; lo < end; {
		lo = g.served.nextUnmarked(lo, end)
		if lo >= end {
			break
		}
		hi := g.served.nextMarked(lo, end)
		run := buf[lo-off : hi-off]
		began := time.Now()
		g.counters.Begin(len(run))
		n, err := g.mem.ReadAt(run, lo)
		switch {
		case n == len(run):
			err = nil
		case err == nil:
			err = io.ErrUnexpectedEOF
		}
		g.counters.End(len(run), n, err)
		if err != nil {
			g.corrupt.note(err)
			return fmt.Errorf("fill %s [%d, %d): read lower file: %w", g.name, lo, hi, err)
		}
		// Marked and heard of before the store: from the store on, the
		// guest can find these pages without a request, and a restore that
		// reaches ready then must count them as brought in, not unused.
		// (An observer that joins meanwhile hears of them as resident.)
		g.served.mark(lo, hi-lo)
		g.observers.served(memdev.Prefetch, lo, int(hi-lo), time.Since(began))
		if errno := inode.WriteCache(lo, run); errno != 0 {
			// Not stored: unmarked, so a later fill brings these pages
			// (the guest meanwhile reads them on demand, with the right
			// bytes); the event stays, erring towards "in time". The
			// kernel refuses a store when it has no inode (no open file,
			// so no read of these pages raced the mark) or the connection
			// went; a read that did race a refusal loses its mark, which
			// costs a later fill one more store of the same bytes.
			g.served.unmark(lo, hi-lo)
			return fmt.Errorf("fill %s [%d, %d): store in page cache: %w", g.name, lo, hi, errno)
		}
		lo = hi
	}
	return nil
}

// pageSet is a concurrent bitmap of device pages.
type pageSet struct{ words []atomic.Uint64 }

func newPageSet(size int64) pageSet {
	pages := (size + fillPageBytes - 1) / fillPageBytes
	return pageSet{words: make([]atomic.Uint64, (pages+63)/64)}
}

// mark sets every page overlapping [off, off+n).
func (s *pageSet) mark(off, n int64) {
	if n <= 0 {
		return
	}
	for p := off / fillPageBytes; p <= (off+n-1)/fillPageBytes; p++ {
		if w := p / 64; w < int64(len(s.words)) {
			s.words[w].Or(1 << (p % 64))
		}
	}
}

// unmark clears every page overlapping [off, off+n).
func (s *pageSet) unmark(off, n int64) {
	if n <= 0 {
		return
	}
	for p := off / fillPageBytes; p <= (off+n-1)/fillPageBytes; p++ {
		if w := p / 64; w < int64(len(s.words)) {
			s.words[w].And(^uint64(1 << (p % 64)))
		}
	}
}

func (s *pageSet) test(p int64) bool {
	w := p / 64
	return w < int64(len(s.words)) && s.words[w].Load()&(1<<(p%64)) != 0
}

// nextUnmarked returns the start of the first unmarked page at or after
// off (page aligned down), or end.
func (s *pageSet) nextUnmarked(off, end int64) int64 {
	p := off / fillPageBytes
	for ; p*fillPageBytes < end; p++ {
		if !s.test(p) {
			return max(off, p*fillPageBytes)
		}
	}
	return end
}

// nextMarked returns the first byte at or after off of a marked page, or end.
func (s *pageSet) nextMarked(off, end int64) int64 {
	for p := off/fillPageBytes + 1; p*fillPageBytes < end; p++ {
		if s.test(p) {
			return p * fillPageBytes
		}
	}
	return end
}

// runs calls fn with each run of marked pages below size, in order.
func (s *pageSet) runs(size int64, fn func(off, n int64)) {
	for lo := int64(0); lo < size; {
		lo = s.nextMarkedFrom(lo, size)
		if lo >= size {
			return
		}
		hi := min(s.nextUnmarked(lo, size), size)
		fn(lo, hi-lo)
		lo = hi
	}
}

// nextMarkedFrom is nextMarked counting the page at off itself.
func (s *pageSet) nextMarkedFrom(off, end int64) int64 {
	if s.test(off / fillPageBytes) {
		return off
	}
	return s.nextMarked(off, end)
}

// Advise tells storage that [off, off+length) of the lower will be read
// soon (memdev.Advisor: POSIX_FADV_WILLNEED on a local file), so it starts
// reading it asynchronously. A prefetch that hints its whole plan up front
// lets the storage queue work on every range at once while fills proceed
// in first-touch order; it changes no byte anyone reads. Lowers that
// cannot be advised ignore it. Like a read, it is refused once the
// generation is released, and release waits for one in progress.
func (d *Device) Advise(off, length int64) error {
	if !d.gen.mem.Advisable() || d.gen.passthrough() {
		// A passthrough fill is itself readahead of the lower file.
		return nil
	}
	if !d.gen.beginRead() {
		return fmt.Errorf("advise %s: %w", d.gen.name, syscall.EIO)
	}
	defer d.gen.inflight.Done()
	if err := d.gen.mem.Advise(off, length); err != nil {
		return fmt.Errorf("advise %s: %w", d.gen.name, err)
	}
	return nil
}
