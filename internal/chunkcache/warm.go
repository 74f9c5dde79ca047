package chunkcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultWarmConcurrency bounds the prefetch GETs one warming has in
// flight. Each GET streams over its own connection, so a few in parallel
// hide the per-request latency without starving demand reads. Measured
// with 1 MiB blocks and 16 MiB runs (see cache.go): 4 at once 489 ms to
// ready, 8 at once 373 ms, 16 at once 412 ms (the 2 cores, not the link,
// limit past 8).
const DefaultWarmConcurrency = 8

// WarmOptions tune a warming. Zero fields take the defaults.
type WarmOptions struct {
	// Concurrency bounds the runs fetched at once.
	Concurrency int `json:"concurrency"`
	// RunCapBytes caps one run (one GET).
	RunCapBytes int64 `json:"run_cap_bytes"`
	// Ramp re-cuts the plan into heads that grow by a block each, then
	// runs of the cap (see Ramp): for a plan read front to back over a
	// link that every run shares.
	Ramp bool `json:"ramp"`
	// HoldWrites keeps the cache's disk writes held (hold.go) after the
	// warming has ended, until ReleaseWrites or Stop: for a restore's
	// startup set, whose restore is still starting when the set is in.
	HoldWrites bool `json:"hold_writes"`
}

// Warming is the executor of one prefetch plan: it fetches the plan's runs
// into the cache with bounded concurrency, in plan order, skipping blocks
// already cached or being fetched. Demand reads of a block a run is
// fetching wait for that run instead of issuing their own GET. It pins the
// object while it runs.
type Warming struct {
	c      *Cache
	obj    Object
	runs   []Run
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	next   atomic.Int64
	// release ends the warming's hold on the cache's disk writes.
	release func()

	gets, fetchedBlocks, skippedBlocks atomic.Int64
	// firstBlockNanos and endedNanos are Unix times (0 until then): when
	// the first fetched block arrived and when the warming ended, so a
	// restore can say where its time went.
	firstBlockNanos, endedNanos atomic.Int64

	mu  sync.Mutex
	err error
}

// WarmStats say what a warming did.
type WarmStats struct {
	// Runs is the number of runs planned; Gets the GETs issued for them
	// (a run whose blocks are partly cached splits into several).
	Runs, Gets int64
	// FetchedBlocks were fetched; SkippedBlocks were cached or in flight
	// already.
	FetchedBlocks, SkippedBlocks int64
}

// Warm plans ranges (see Plan) and starts fetching the runs in the
// background; it returns at once. The warming ends by itself when every
// run is done or one fails; Stop ends it early.
func (c *Cache) Warm(obj Object, ranges []Range, o WarmOptions) (*Warming, error) {
	if err := obj.validate(); err != nil {
		return nil, fmt.Errorf("warm %s: %w", obj.ID, err)
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultWarmConcurrency
	}
	if o.RunCapBytes <= 0 {
		o.RunCapBytes = DefaultRunCapBytes
	}
	runs, err := Plan(ranges, obj.Size, c.blockBytes, o.RunCapBytes)
	if err != nil {
		return nil, fmt.Errorf("warm %s: %w", obj.ID, err)
	}
	if o.Ramp {
		runs = Ramp(runs, o.Concurrency, max(1, o.RunCapBytes/c.blockBytes))
	}
	if err := c.begin(); err != nil {
		return nil, fmt.Errorf("warm %s: %w", obj.ID, err)
	}
	c.pin(obj.ID)
	w := &Warming{c: c, obj: obj, runs: runs, done: make(chan struct{}), release: c.holdWrites()}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	workers := min(o.Concurrency, len(runs))
	go func() {
		defer c.ops.Done()
		defer c.unpin(obj.ID)
		if !o.HoldWrites {
			defer w.release()
		}
		defer close(w.done)
		defer func() { w.endedNanos.Store(time.Now().UnixNano()) }()
		defer w.cancel()
		var wg sync.WaitGroup
		for range workers {
			wg.Go(w.work)
		}
		wg.Wait()
	}()
	return w, nil
}

// Runs returns the plan.
func (w *Warming) Runs() []Run { return w.runs }

// Done is closed once the warming has ended and none of its GETs is in
// progress.
func (w *Warming) Done() <-chan struct{} { return w.done }

// Stop cancels the runs not yet fetched and the GETs in progress that no
// demand read waits on, waits for the warming to end and releases its
// hold on the disk writes; a GET a demand
// read waits on goes on for that read. Readers that were waiting on a
// cancelled run fetch the block themselves. Safe to call more than once.
func (w *Warming) Stop() {
	w.cancel()
	<-w.done
	w.release()
}

// ReleaseWrites ends the warming's hold on the cache's disk writes
// (WarmOptions.HoldWrites); Stop ends it too.
func (w *Warming) ReleaseWrites() { w.release() }

// Arrival says when the warming's first fetched block arrived and when the
// warming ended; each is zero until it happened.
func (w *Warming) Arrival() (firstBlock, ended time.Time) {
	return unixNanos(w.firstBlockNanos.Load()), unixNanos(w.endedNanos.Load())
}

func unixNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// noteBlock records that one of the warming's blocks arrived.
func (w *Warming) noteBlock() {
	w.firstBlockNanos.CompareAndSwap(0, time.Now().UnixNano())
}

// Err is the first fetch error, nil if none (Stop is not an error).
func (w *Warming) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Stats returns what the warming has done so far.
func (w *Warming) Stats() WarmStats {
	return WarmStats{
		Runs: int64(len(w.runs)), Gets: w.gets.Load(),
		FetchedBlocks: w.fetchedBlocks.Load(), SkippedBlocks: w.skippedBlocks.Load(),
	}
}

// work fetches runs in plan order until none is left, the warming is
// stopped, or a fetch fails (then the others stop too: the store is
// likely unreachable, and demand reads will say so themselves).
func (w *Warming) work() {
	for w.ctx.Err() == nil {
		i := w.next.Add(1) - 1
		if i >= int64(len(w.runs)) {
			return
		}
		if err := w.fetch(w.runs[i]); err != nil {
			if w.ctx.Err() != nil && errors.Is(err, context.Canceled) {
				return
			}
			w.mu.Lock()
			if w.err == nil {
				w.err = err
			}
			w.mu.Unlock()
			w.cancel()
			return
		}
	}
}

// fetch registers flights for the run's blocks that are neither cached nor
// in flight and fetches each consecutive group of them with one GET. The
// GETs are a job (job.go) the warming holds until they end or it is
// stopped: stopped, it returns at once, and a GET a demand read waits on
// goes on for that read.
func (w *Warming) fetch(run Run) error {
	c := w.c
	job := newFetchJob(w.ctx)
	var groups []fetchGroup
	c.mu.Lock()
	for idx := run.First; idx < run.First+run.Count; idx++ {
		key := blockKey{w.obj.ID, idx}
		if e := c.entries[key]; e != nil {
			c.touchLocked(e) // about to be read: keep it
			w.skippedBlocks.Add(1)
			continue
		}
		if c.flights[key] != nil {
			w.skippedBlocks.Add(1)
			continue
		}
		f := newFlight(job)
		c.flights[key] = f
		if n := len(groups); n > 0 && groups[n-1].first+int64(len(groups[n-1].flights)) == idx {
			groups[n-1].flights = append(groups[n-1].flights, f)
		} else {
			groups = append(groups, fetchGroup{first: idx, flights: []*flight{f}})
		}
	}
	c.mu.Unlock()
	done := make(chan error, 1)
	c.runJob(job, func(ctx context.Context) { done <- w.fetchGroups(ctx, groups) })
	var err error
	select {
	case err = <-done:
	case <-w.ctx.Done():
		err = w.ctx.Err()
	}
	c.letGo(w.ctx, []*fetchJob{job})
	return err
}

// fetchGroup is consecutive blocks a warming fetches with one GET.
type fetchGroup struct {
	first   int64
	flights []*flight
}

// fetchGroups fetches groups one after the other under ctx, the context
// of their job.
func (w *Warming) fetchGroups(ctx context.Context, groups []fetchGroup) error {
	c := w.c
	for i, g := range groups {
		if err := ctx.Err(); err != nil {
			// Registered but never fetched: release them to demand reads.
			for _, rest := range groups[i:] {
				c.failFlights(w.obj.ID, rest.first, rest.flights, err, false)
			}
			return err
		}
		w.gets.Add(1)
		if err := c.fetchRun(ctx, &w.obj, g.first, g.flights, w); err != nil {
			for _, rest := range groups[i+1:] {
				c.failFlights(w.obj.ID, rest.first, rest.flights, err, holdsOff(ctx, err))
			}
			return err
		}
		w.fetchedBlocks.Add(int64(len(g.flights)))
	}
	return nil
}
