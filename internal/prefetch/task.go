package prefetch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
)

// read is one Fetch: at most one buffer's worth of contiguous memory.
type read struct {
	off int64
	n   int
}

// task is one in-flight prefetch, shared by every Subscription of its key.
type task struct {
	e   *Engine
	key Key

	// Set before the task starts, read by its readers, and dropped when it
	// ends so that an ended task holds no reference to the device.
	target      Target
	readers     int
	bufferBytes int
	planErr     error
	planReads   int
	planBytes   int64
	// sched orders the plan's reads; it is dropped when the task ends,
	// so that a retained task holds no plan and a late Follow is a no-op.
	sched atomic.Pointer[schedule]

	// ctx is cancelled when the last consumer leaves or a read fails; no
	// read starts after that.
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}

	readsDone    atomic.Int64
	bytesFetched atomic.Int64

	// Guarded by e.mu.
	consumers int
	state     State
	err       error
}

func (e *Engine) newTask(key Key, target Target, ranges []Range, opts TaskOptions) *task {
	t := &task{e: e, key: key, target: target, done: make(chan struct{})}
	t.ctx, t.cancel = context.WithCancelCause(context.Background())
	bufferBytes := positiveOr(opts.BufferBytes, e.bufferBytes)
	if target == nil {
		t.planErr = ErrNoTarget
		return t
	}
	reads, err := plan(ranges, bufferBytes)
	if err != nil {
		t.planErr = err
		return t
	}
	// A buffer larger than the largest read, or more readers than reads or
	// than may read at once, would only hold memory.
	for _, r := range reads {
		t.bufferBytes = max(t.bufferBytes, r.n)
		t.planBytes += int64(r.n)
	}
	t.planReads = len(reads)
	t.readers = min(positiveOr(opts.Readers, e.readersPerTask), len(reads), e.maxReaders)
	t.sched.Store(newSchedule(reads, opts.Follow))
	return t
}

// plan turns manifest ranges into reads, in manifest order: a range longer
// than the buffer is split, and a range that starts exactly where the
// previous read ends extends that read while the buffer has room.
// Zero-length ranges are skipped.
func plan(ranges []Range, bufferBytes int) ([]read, error) {
	var reads []read
	for i, r := range ranges {
		if r.Offset < 0 || r.Length < 0 || r.Offset > math.MaxInt64-r.Length {
			return nil, fmt.Errorf("%w: range %d at offset %d length %d", ErrInvalidRange, i, r.Offset, r.Length)
		}
		off, rest := r.Offset, r.Length
		if n := len(reads); n > 0 && rest > 0 {
			last := &reads[n-1]
			if last.off+int64(last.n) == off && last.n < bufferBytes {
				grow := min(rest, int64(bufferBytes-last.n))
				last.n += int(grow)
				off += grow
				rest -= grow
			}
		}
		for rest > 0 {
			n := min(rest, int64(bufferBytes))
			reads = append(reads, read{off: off, n: int(n)})
			off += n
			rest -= n
		}
	}
	return reads, nil
}

func (t *task) shareableLocked() bool {
	if t.state.Ended() {
		return t.state == Completed
	}
	return t.consumers > 0
}

func (t *task) run() {
	var (
		failOnce sync.Once
		failure  error
		readers  sync.WaitGroup
	)
	sched := t.sched.Load()
	for range t.readers {
		readers.Go(func() {
			if err := t.readLoop(sched); err != nil {
				failOnce.Do(func() {
					failure = err
					t.cancel(err) // the other readers stop before their next read
				})
			}
		})
	}
	readers.Wait()
	t.finish(failure)
}

// readLoop claims reads in the schedule's order until none is left, the
// task is cancelled, or a read fails.
func (t *task) readLoop(sched *schedule) error {
	var (
		buf     []byte
		started bool
		slots   = t.e.slots
	)
	for {
		i, deferred, ok := sched.claim()
		if !ok {
			return nil
		}
		r := sched.reads[i]
		select {
		case slots <- struct{}{}:
		case <-t.ctx.Done():
			return nil
		}
		// When cancellation races with getting a slot, select may pick
		// either; cancellation must win so that no read starts after it.
		if t.ctx.Err() != nil {
			<-slots
			return nil
		}
		if !started {
			started = true
			t.markRunning()
			buf = make([]byte, t.bufferBytes)
		}
		t.e.readerStarted()
		if deferred {
			t.e.deferredReads.Add(1)
		}
		err := t.target.Fetch(t.ctx, r.off, buf[:r.n])
		t.e.readerReturned(r.n, err)
		<-slots
		if err != nil {
			if t.ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.Cause(t.ctx))) {
				return nil // the target honoured our cancellation; not a failure of its own
			}
			return fmt.Errorf("prefetch [%d, %d) for %s: %w", r.off, r.off+int64(r.n), t.key, err)
		}
		t.readsDone.Add(1)
		t.bytesFetched.Add(int64(r.n))
	}
}

func (t *task) markRunning() {
	t.e.mu.Lock()
	defer t.e.mu.Unlock()
	if t.state == Queued {
		t.state = Running
	}
}

// finish records the outcome once every reader has returned, then announces
// it. Counters are updated first so that whoever wakes on done sees them.
func (t *task) finish(failure error) {
	e := t.e
	e.mu.Lock()
	switch {
	case t.planErr != nil:
		t.state, t.err = Failed, fmt.Errorf("prefetch %s: %w", t.key, t.planErr)
	case failure != nil:
		t.state, t.err = Failed, failure
	case t.readsDone.Load() == int64(t.planReads):
		t.state, t.err = Completed, nil
	default:
		t.state, t.err = Cancelled, ErrCancelled
	}
	state := t.state
	t.target = nil
	t.sched.Store(nil)
	e.mu.Unlock()
	t.cancel(nil)

	switch state {
	case Completed:
		e.tasksCompleted.Add(1)
	case Cancelled:
		e.tasksCancelled.Add(1)
	case Failed:
		e.tasksFailed.Add(1)
	}
	close(t.done)
}

// follow moves the task's cursor to the guest's position in the plan, if
// the task follows the guest and is still reading.
func (t *task) follow(off int64, n int) {
	if sched := t.sched.Load(); sched != nil && sched.followTo(off, int64(n)) {
		t.e.jumps.Add(1)
	}
}
