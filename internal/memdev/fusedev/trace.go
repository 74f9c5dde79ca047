package fusedev

import (
	"os"
	"slices"
	"sync"
	"time"

	"warmstart/internal/memdev"
)

// tracePageBytes is the granularity of first touches: the host page, which
// is what the VMM faults and the page cache holds.
var tracePageBytes = int64(os.Getpagesize())

// tracer records the first request covering each page of a generation.
type tracer struct {
	mu      sync.Mutex
	active  bool
	started time.Time
	seen    []uint64 // one bit per page
	touches []memdev.Touch
}

func (t *tracer) start(size int64) {
	pages := (size + tracePageBytes - 1) / tracePageBytes
	t.mu.Lock()
	defer t.mu.Unlock()
	t.active = true
	t.started = time.Now()
	t.seen = make([]uint64, (pages+63)/64)
	t.touches = nil
}

// record notes a request for [off, off+n), off within the traced size.
func (t *tracer) record(off int64, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.active || n <= 0 {
		return
	}
	nanos := time.Since(t.started).Nanoseconds()
	first := off / tracePageBytes
	last := (off + int64(n) - 1) / tracePageBytes
	for p := first; p <= last; p++ {
		w, bit := p/64, uint64(1)<<(p%64)
		if w >= int64(len(t.seen)) {
			break
		}
		if t.seen[w]&bit != 0 {
			continue
		}
		t.seen[w] |= bit
		t.touches = append(t.touches, memdev.Touch{Offset: p * tracePageBytes, Nanos: nanos})
	}
}

func (t *tracer) snapshot() []memdev.Touch {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.touches)
}

func (t *tracer) stop() []memdev.Touch {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.active = false
	return slices.Clone(t.touches)
}
