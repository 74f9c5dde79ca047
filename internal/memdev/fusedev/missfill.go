package fusedev

import (
	"sync"

	"warmstart/internal/memdev"
)

// missFillsInFlight bounds the miss fills a generation runs at once; a
// miss that finds them all busy gets only readAroundLower's hint. A fill
// never delays the read that started it.
const missFillsInFlight = 2

// missFill is a generation's state for filling around demand misses.
type missFill struct {
	slots chan struct{}
	bufs  sync.Pool
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
		slots: make(chan struct{}, missFillsInFlight),
		bufs:  sync.Pool{New: func() any { b := make([]byte, window); return &b }},
	}
}

// fillAroundMiss, for a guest's demand read of [off, off+n) on a mount
// with Options.MissFillBytes wider than its window, stores the pages of
// the window around it that the generation has not served into the
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
	if mf == nil || kind != memdev.Demand || g.ioEngine == memdev.IOEngineDirect || !g.mem.Advisable() {
		return
	}
	select {
	case mf.slots <- struct{}{}:
	default:
		return
	}
	buf := mf.bufs.Get().(*[]byte)
	window := int64(len(*buf))
	start := max(0, off+int64(n)/2-window/2) &^ (fillPageBytes - 1)
	size := min(window, g.size-start)
	go func() {
		defer func() { mf.bufs.Put(buf); <-mf.slots }()
		// Errors are the next fault's to meet: a page left out is read
		// on demand, and a damaged one is refused and noted there.
		_ = g.fill(start, (*buf)[:size])
	}()
}
