package fusedev

import (
	"sync"

	"warmstart/internal/memdev"
)

const (
	// missFillsInFlight bounds the miss fills a generation runs at once; a
	// miss that finds them all busy gets only readAroundLower's hint. A
	// fill never delays the read that started it.
	missFillsInFlight = 2
	// missRunMaxFactor bounds a run's fill at this many windows: a guest
	// running through a stretch its manifest did not know faults once per
	// missRunMaxFactor windows at most, and a run's end over-reads at most
	// that much.
	missRunMaxFactor = 8
	// missRuns is how many runs a generation follows at once (one per
	// vCPU running through unknown memory, as readahead keeps a state per
	// open file).
	missRuns = 4
	// missFillFirstBytes after a miss are stored first, on their own
	// (fillOrder).
	missFillFirstBytes = 4 * fillPageBytes
)

// missRun is one run of misses: its last miss was at start, the fills so
// far reach end, and the next fill of the run is twice window.
type missRun struct {
	start, end int64
	window     int64
}

// missFill is a generation's state for filling around demand misses.
type missFill struct {
	window int64 // an isolated miss's window
	slots  chan struct{}
	bufs   sync.Pool

	mu   sync.Mutex
	runs [missRuns]missRun
	next int // the run a new isolated miss replaces
}

// MissFillBytes is the window the mount fills around a demand miss on a
// local lower, 0 when it fills none.
func (s *Server) MissFillBytes() int { return s.missFillBytes() }

// missFillBytes is the mount's miss fill window: Options.MissFillBytes
// when it is wider than the kernel's readaround window, else none.
func (s *Server) missFillBytes() int {
	if s.opts.MissFillBytes <= s.readAheadBytes {
		return 0
	}
	return s.opts.MissFillBytes &^ (fillPageBytes - 1)
}

func newMissFill(window int) *missFill {
	if window <= 0 {
		return nil
	}
	return &missFill{
		window: int64(window),
		slots:  make(chan struct{}, missFillsInFlight),
		bufs: sync.Pool{New: func() any {
			b := make([]byte, missRunMaxFactor*window)
			return &b
		}},
	}
}

// span is what to fill after a demand read of [off, off+n) of a device of
// size bytes. A read at or after a run's last miss and at most a window
// past the end of its fills continues the run: the guest is running through
// memory its manifest did not know, so the fill goes forward from where
// the run's last one ended and doubles (readahead's window doubling), up
// to missRunMaxFactor windows. Any other read is an isolated miss: the
// window centred on it, and the start of a new run.
func (mf *missFill) span(off int64, n int, size int64) (start, end int64) {
	mf.mu.Lock()
	defer mf.mu.Unlock()
	for i := range mf.runs {
		r := &mf.runs[i]
		if r.window == 0 || off < r.start || off >= r.end+mf.window {
			continue
		}
		w := min(2*r.window, missRunMaxFactor*mf.window)
		// The run covers w bytes more from where it had reached.
		start = pageUp(max(off+int64(n), r.end))
		end = min(max(off, r.end)+w, size)
		*r = missRun{start: off, end: end, window: w}
		return start, end
	}
	start = max(0, off+int64(n)/2-mf.window/2) &^ (fillPageBytes - 1)
	end = min(start+mf.window, size)
	// A fault behind the miss, in its window, is not the run going on.
	mf.runs[mf.next] = missRun{start: off, end: end, window: mf.window}
	mf.next = (mf.next + 1) % len(mf.runs)
	return start, end
}

func pageUp(off int64) int64 { return (off + fillPageBytes - 1) &^ (fillPageBytes - 1) }

// fillAroundMiss, for a guest's demand read of [off, off+n) on a mount
// with Options.MissFillBytes wider than its window, stores the pages
// around it (missFill.span) that the generation has not served into the
// device file's page cache, in the background: the guest's next faults
// nearby then find them there, as with the serving mount's readaround,
// while the read itself reached the device as the pages it asked for
// (the accounting's demand). The filled pages are reported as prefetch:
// brought into the guest's reach before it asked. Only a local lower is
// filled around (memdev.Memory.Advisable): a remote one has its own
// readahead.
//
// The fill runs after the read is answered, never inside it: storing
// into the page cache waits for the lock of any page a read in flight
// holds, and two handlers each storing around the other's page would
// wait for each other.
func (g *generation) fillAroundMiss(kind memdev.Kind, off int64, n int) {
	mf := g.missFill
	// A writable view is never filled (fill refuses it): leave the slot,
	// the buffer and the goroutine to the views that can be.
	if mf == nil || kind != memdev.Demand || g.overlay != nil || g.ioEngine == memdev.IOEngineDirect || !g.mem.Advisable() {
		return
	}
	select {
	case mf.slots <- struct{}{}:
	default:
		return
	}
	start, end := mf.span(off, n, g.size)
	if start >= end {
		<-mf.slots
		return
	}
	buf := mf.bufs.Get().(*[]byte)
	go func() {
		defer func() { mf.bufs.Put(buf); <-mf.slots }()
		b := (*buf)[:end-start]
		for _, p := range fillOrder(start, end, pageUp(off+int64(n))) {
			// Errors are the next fault's to meet: a page left out is
			// read on demand, and a damaged one is refused and noted
			// there.
			if g.fill(p.lo, b[p.lo-start:p.hi-start]) != nil {
				return
			}
		}
	}()
}

// byteRange is a byte range [lo, hi) of the device.
type byteRange struct{ lo, hi int64 }

// fillOrder cuts a fill of [start, end) around a demand read that ended
// at after into the order it is stored in: the missFillFirstBytes right
// after the read, then the rest after it, then what lies before it. A
// guest that ran into memory its manifest did not know most likely
// touches the pages after the miss next: each store holds the locks of
// the pages it stores until it is done, and a page not yet stored is
// another fault, so the nearest pages go first in a store of their own,
// and the pages behind the guest last. Empty parts are left out.
func fillOrder(start, end, after int64) []byteRange {
	a := min(max(after, start), end)
	first := min(a+missFillFirstBytes, end)
	var parts []byteRange
	for _, p := range []byteRange{{a, first}, {first, end}, {start, a}} {
		if p.lo < p.hi {
			parts = append(parts, p)
		}
	}
	return parts
}
