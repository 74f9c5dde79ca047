package memdev

import (
	"errors"
	"sync"

	"warmstart/internal/prefetch"
)

// Hint advises storage of each range of plan, in order. Hints only start
// reads; a failed one costs nothing but speed, so the first failure stops
// the hinting and nothing else.
func Hint(advise func(off, length int64) error, plan []prefetch.Range) {
	for _, r := range plan {
		if advise(r.Offset, r.Length) != nil {
			return
		}
	}
}

// PlanHint advises storage of a plan (Hint) once, in the background, until
// it is stopped. A stop is prompt: on a cold lower one advice can take as
// long as a read, and a plan has thousands of ranges, so once Stop begins
// every further advice fails (which ends Hint) and Stop waits only for the
// one in progress.
type PlanHint struct {
	advise   func(off, length int64) error
	plan     []prefetch.Range
	once     sync.Once
	stopOnce sync.Once
	stopping chan struct{}
	ended    chan struct{}
}

// NewPlanHint is the hint of plan through advise, not yet started.
func NewPlanHint(advise func(off, length int64) error, plan []prefetch.Range) *PlanHint {
	return &PlanHint{advise: advise, plan: plan, stopping: make(chan struct{}), ended: make(chan struct{})}
}

// Start starts the hint, unless it started or Stop ran before.
func (h *PlanHint) Start() {
	h.once.Do(func() {
		go func() {
			defer close(h.ended)
			Hint(h.adviseUnlessStopping, h.plan)
		}()
	})
}

// errHintStopped ends a hint whose Stop has begun.
var errHintStopped = errors.New("storage hint stopped")

func (h *PlanHint) adviseUnlessStopping(off, length int64) error {
	select {
	case <-h.stopping:
		return errHintStopped
	default:
		return h.advise(off, length)
	}
}

// Stop ends the hint: no advice starts once it has begun, and it returns
// when the one in progress (if any) has, so that no advice runs after it.
// A hint not started by then never starts.
func (h *PlanHint) Stop() {
	h.Cancel()
	<-h.ended
}

// Cancel is Stop without the wait: Ended says when the advice in progress
// has returned.
func (h *PlanHint) Cancel() {
	h.stopOnce.Do(func() { close(h.stopping) })
	h.once.Do(func() { close(h.ended) })
}

// Ended closes once the hint has ended, or was cancelled before it started.
func (h *PlanHint) Ended() <-chan struct{} { return h.ended }

// Stopping closes when Stop begins.
func (h *PlanHint) Stopping() <-chan struct{} { return h.stopping }
