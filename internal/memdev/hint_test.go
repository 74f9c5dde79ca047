package memdev

import (
	"sync/atomic"
	"testing"
	"time"

	"warmstart/internal/prefetch"
)

// manyRanges is a plan of n one-page ranges.
func manyRanges(n int) []prefetch.Range {
	plan := make([]prefetch.Range, n)
	for i := range plan {
		plan[i] = prefetch.Range{Offset: int64(i) << 12, Length: 4096}
	}
	return plan
}

// A stop of a hint whose first advice waits on storage (a cold lower)
// until the stop has begun returns after that one advice: the rest of the
// plan is never advised, and no advice runs after Stop returns.
func TestPlanHintStopEndsTheHintAfterTheAdviceInProgress(t *testing.T) {
	var calls, afterStop atomic.Int64
	var stopped atomic.Bool
	entered := make(chan struct{})
	var h *PlanHint
	h = NewPlanHint(func(off, length int64) error {
		if stopped.Load() {
			afterStop.Add(1)
		}
		if calls.Add(1) == 1 {
			close(entered)
			<-h.Stopping()
		}
		return nil
	}, manyRanges(10000))
	h.Start()
	<-entered
	done := make(chan struct{})
	go func() {
		h.Stop()
		stopped.Store(true)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("Stop still waiting after %d advices of a 10000-range plan", calls.Load())
	}
	h.Start() // a hint runs once: this starts nothing
	h.Stop()
	if n, late := calls.Load(), afterStop.Load(); n != 1 || late != 0 {
		t.Fatalf("stop during the first advice: %d advices, %d after Stop returned; want 1 and 0", n, late)
	}
}

// A hint stopped before it started never starts.
func TestPlanHintStoppedBeforeItStartedNeverStarts(t *testing.T) {
	var calls atomic.Int64
	h := NewPlanHint(func(off, length int64) error {
		calls.Add(1)
		return nil
	}, manyRanges(3))
	h.Stop()
	h.Start()
	h.Stop()
	if n := calls.Load(); n != 0 {
		t.Fatalf("a hint stopped before its start advised %d ranges", n)
	}
}
