package uffd

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"warmstart/internal/memdev"
)

// tracer records the first fault on each page. Faults are the touches of
// the uffd device: a page Install placed before the guest reached it never
// faults, so it is not a touch.
type tracer struct {
	pages  int // size of the session's page index space
	active atomic.Bool

	mu      sync.Mutex
	started time.Time
	seen    []uint64 // bitmap over page indexes
	touches []memdev.Touch
}

func (t *tracer) start() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.started = time.Now()
	t.seen = make([]uint64, (t.pages+63)/64)
	t.touches = nil
	t.active.Store(true)
}

func (t *tracer) stop() { t.active.Store(false) }

func (t *tracer) record(page int, logical int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.active.Load() || t.seen[page/64]&(1<<(page%64)) != 0 {
		return
	}
	t.seen[page/64] |= 1 << (page % 64)
	t.touches = append(t.touches, memdev.Touch{Offset: logical, Nanos: time.Since(t.started).Nanoseconds()})
}

func (t *tracer) snapshot() []memdev.Touch {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.touches)
}

// StartTrace discards any earlier trace and records, from now on, the first
// fault on each page: its logical offset (page aligned) and the monotonic
// time since this call, in fault order. Options.Trace starts tracing before
// the first fault can arrive.
func (s *Session) StartTrace() { s.trace.start() }

// StopTrace stops recording; the trace recorded so far is kept.
func (s *Session) StopTrace() { s.trace.stop() }

// Trace returns a copy of the touches recorded so far.
func (s *Session) Trace() []memdev.Touch { return s.trace.snapshot() }
