// Package startupset accounts for the startup set of one restore: what the
// memory device served, on demand or by prefetch, until the guest was
// ready, and what that says of every page of the startup manifest (in
// time, late, unused) and of every page the guest needed outside it
// (missed). It also formats the one line a person reads after a restore.
package startupset

import (
	"slices"
	"sync"
	"time"

	"warmstart/internal/memdev"
)

// Event is one range a memory device served during a restore.
type Event struct {
	Kind   memdev.Kind `json:"kind"`
	Offset int64       `json:"offset"`
	Length int         `json:"length"`
	// At is when the range was in the guest's reach, from the start of
	// the restore; Took is how long serving it took, so At-Took is when
	// the request arrived (for a fault: when the guest touched the page).
	At   time.Duration `json:"at_ns"`
	Took time.Duration `json:"took_ns"`
}

// Arrived is when the request for the event's range reached the device.
func (e Event) Arrived() time.Duration { return max(e.At-e.Took, 0) }

// ByReady says whether the event belongs to the restore until ready: a
// demand request that arrived by then (its reply may have raced the
// guest's ready report), a prefetch run in reach by then, and every
// resident range.
func (e Event) ByReady(ready time.Duration) bool {
	switch e.Kind {
	case memdev.Demand:
		return e.Arrived() <= ready
	case memdev.Resident:
		return true
	}
	return e.At <= ready
}

// Timeline is a memdev.Observer that keeps every event of one restore,
// timed from its start.
type Timeline struct {
	t0 time.Time

	mu      sync.Mutex
	stopped bool
	events  []Event
}

var _ memdev.Observer = (*Timeline)(nil)

// NewTimeline times events from t0, the start of the restore.
func NewTimeline(t0 time.Time) *Timeline { return &Timeline{t0: t0} }

// Served implements memdev.Observer.
func (r *Timeline) Served(kind memdev.Kind, off int64, n int, took time.Duration) {
	at := time.Since(r.t0)
	if kind == memdev.Resident {
		at, took = 0, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopped {
		r.events = append(r.events, Event{Kind: kind, Offset: off, Length: n, At: at, Took: took})
	}
}

// Stop ends recording: later events are dropped.
func (r *Timeline) Stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
}

// Events returns a copy of the events recorded so far, in arrival order.
func (r *Timeline) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}
