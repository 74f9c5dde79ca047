package chunkcache

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// fetchJob is the GETs one read or one warming run started for the
// flights it registered. They run under the job's own context, not under
// the starter's: readers of other restores may join those flights (one
// fetch per block), and when the starter gives up (its restore stops) the
// fetch must go on for them rather than fail under them. Every reader
// waiting on one of the job's flights holds the job; the job is cancelled,
// with the cause of the last one to give up, once none holds it.
type fetchJob struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	// holds counts the reads and warmings holding the job; under Cache.mu.
	holds int
	// fetches are the job's GETs in progress; started says whether the
	// job ever had one (most reads hit the cache and start none).
	fetches sync.WaitGroup
	started atomic.Bool
}

// newFetchJob starts a job held once, by its starter, whose ctx it keeps
// the values of but not the cancellation.
func newFetchJob(ctx context.Context) *fetchJob {
	jctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	return &fetchJob{ctx: jctx, cancel: cancel, holds: 1}
}

// abandoned reports whether the job was cancelled: a flight of it is not
// worth joining, its fetch is ending.
func (j *fetchJob) abandoned() bool { return j.ctx.Err() != nil }

// holdLocked adds a hold on j (c.mu is held).
func (j *fetchJob) holdLocked() { j.holds++ }

// letGo drops one hold on each of jobs (a job may appear more than once:
// one hold each time) for a holder whose context is ctx. When the holder
// gave up (ctx is done), a job nobody holds any more is cancelled with
// ctx's cause, and letGo waits for its GETs to end: cancelled, they end
// at once, and a reader that gave up on a block then returns only once
// the block's failure is recorded, so the read a restarted page fault
// makes next finds the failure holdoff (see DefaultFailureHoldoff) rather
// than a new GET. A holder that got what it wanted leaves the job's GETs
// to complete their blocks, which are then cached.
func (c *Cache) letGo(ctx context.Context, jobs []*fetchJob) {
	var ended []*fetchJob
	c.mu.Lock()
	for _, j := range jobs {
		if j.holds--; j.holds == 0 && ctx.Err() != nil {
			// Under c.mu, so that no read joins a flight of j in between.
			j.cancel(context.Cause(ctx))
			ended = append(ended, j)
		}
	}
	c.mu.Unlock()
	for _, j := range ended {
		j.fetches.Wait()
	}
}

// awaitJob waits until j's GETs have ended, or ctx has. A read returns
// once its own GETs have completed their blocks (cached, or failed and
// held off), as it did when it fetched them itself, although it may
// have its bytes earlier (a block's leading bytes reach readers as they
// arrive); a read given up does not wait.
func (c *Cache) awaitJob(ctx context.Context, j *fetchJob) {
	if !j.started.Load() {
		return // nothing to wait for: no goroutine on the cache-hit path
	}
	ended := make(chan struct{})
	go func() {
		j.fetches.Wait()
		close(ended)
	}()
	select {
	case <-ended:
	case <-ctx.Done():
	}
}

// runJob runs fetch as one of j's GETs, in its own goroutine, counted as an
// operation of the cache (Close waits for it).
func (c *Cache) runJob(j *fetchJob, fetch func(ctx context.Context)) {
	c.ops.Add(1)
	j.fetches.Add(1)
	j.started.Store(true)
	go func() {
		defer c.ops.Done()
		defer j.fetches.Done()
		fetch(j.ctx)
	}()
}

// holdsOff reports whether a fetch that failed with err under ctx puts
// its blocks in the failure holdoff. A fetch given up (every reader of it
// gave up, its warming was stopped) says nothing about the store; one
// that timed out (its last reader's deadline) or failed on its own does.
func holdsOff(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return errors.Is(context.Cause(ctx), context.DeadlineExceeded)
	}
	return !errors.Is(err, context.Canceled)
}
