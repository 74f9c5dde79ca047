package chunkcache

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	// Concurrency is the base of the runs fetched at once: the warming
	// adds GETs while their first-byte wait is a large share of their
	// time, up to 4x (at most 32; see depth).
	Concurrency int `json:"concurrency"`
	// RunCapBytes caps one run (one GET).
	RunCapBytes int64 `json:"run_cap_bytes"`
	// Ramp staggers the first runs (see Ramp): for a plan read front to
	// back over a link that every run shares.
	Ramp bool `json:"ramp"`
	// HoldWrites keeps the cache's disk writes held (hold.go) after the
	// warming has ended, until ReleaseWrites or Stop: for a restore's
	// startup set, whose restore is still starting when the set is in.
	HoldWrites bool `json:"hold_writes"`
}

// Warming is the executor of one prefetch plan: it fetches the plan's runs
// into the cache with a bounded depth that follows the round trip (see
// depth), in plan order, skipping blocks already cached or being fetched.
// Demand reads of a block a run is fetching wait for that run instead of
// issuing their own GET. It pins the object while it runs.
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

	// workers run work; depth decides how many (see depth).
	workers sync.WaitGroup
	depth   depth
	// blocksFrom[i] is the blocks of runs[i:].
	blocksFrom []int64
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
		runs = Ramp(runs, o.Concurrency)
	}
	if err := c.begin(); err != nil {
		return nil, fmt.Errorf("warm %s: %w", obj.ID, err)
	}
	c.pin(obj.ID)
	w := &Warming{c: c, obj: obj, runs: runs, done: make(chan struct{}), release: c.holdWrites()}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.depth = newDepth(o.Concurrency)
	w.blocksFrom = make([]int64, len(runs)+1)
	for i := len(runs) - 1; i >= 0; i-- {
		w.blocksFrom[i] = w.blocksFrom[i+1] + runs[i].Count
	}
	go func() {
		defer c.ops.Done()
		defer c.unpin(obj.ID)
		if !o.HoldWrites {
			defer w.release()
		}
		defer close(w.done)
		defer func() { w.endedNanos.Store(time.Now().UnixNano()) }()
		defer w.cancel()
		w.grow(0)
		w.workers.Wait()
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
	defer w.depth.leave()
	for w.ctx.Err() == nil && w.depth.stay(w.meanRunBytesLeft()) {
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
		w.grow(1)
	}
}

// grow starts workers up to the depth's target, never more than the runs
// not yet taken less the idle workers about to take them.
func (w *Warming) grow(idle int64) {
	left := int64(len(w.runs)) - w.next.Load() - idle
	for n := w.depth.add(w.meanRunBytesLeft(), left); n > 0; n-- {
		w.workers.Go(w.work)
	}
}

// meanRunBytesLeft is the mean length of the runs not yet taken, 0 if
// none is left.
func (w *Warming) meanRunBytesLeft() int64 {
	i := min(w.next.Load(), int64(len(w.runs)))
	if i == int64(len(w.runs)) {
		return 0
	}
	return w.blocksFrom[i] * w.c.blockBytes / (int64(len(w.runs)) - i)
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
		clock := &getClock{}
		obj := w.obj
		obj.Fetch = clock.fetch(w.obj.Fetch)
		if err := c.fetchRun(ctx, &obj, g.first, g.flights, w); err != nil {
			for _, rest := range groups[i+1:] {
				c.failFlights(w.obj.ID, rest.first, rest.flights, err, holdsOff(ctx, err))
			}
			return err
		}
		w.fetchedBlocks.Add(int64(len(g.flights)))
		if wait, transfer, ok := clock.split(); ok {
			end := min(w.obj.Size, (g.first+int64(len(g.flights)))*c.blockBytes)
			w.depth.observe(wait, transfer, end-g.first*c.blockBytes)
		}
	}
	return nil
}

// depth is how many GETs a warming keeps in flight. Each GET spends its
// time in two parts: the wait W for its first byte (the round trip plus
// the store's time to answer) and the transfer X of its bytes. Of N GETs
// in flight, N*X/(W+X) are transferring on average; to have the base
// Concurrency C of them transferring, as a short round trip does with C
// in flight, N = C*(W+X)/X = C*(1+W/X).
//
// Both are measured from the warming's own GETs. W is the shortest first
// byte wait seen: a GET queued behind others on a full link waits longer
// for its first byte, and counting that queueing as round trip would add
// GETs to a link that is already full, which queues them longer still.
// X is the mean size of the runs left times the transfer time per byte
// seen (all GETs' transfer time over all their bytes): the ramp's first
// GETs are short heads, and the runs to come are what the target is for.
// X is measured while GETs share the link, so more GETs than the link
// carries stretch it and lower the target: the rule settles by itself.
// N never falls below C, and is capped at 4C (at most 32, or C if C is
// larger) so that a store that answers slowly cannot open unbounded GETs.
type depth struct {
	mu                  sync.Mutex
	base, limit, active int
	// left counts workers stay sent away whose leave is still to come.
	left int
	// minWait is the shortest first-byte wait (0: none measured yet);
	// transfer and bytes sum the GETs' transfers.
	minWait, transfer time.Duration
	bytes             int64
}

func newDepth(base int) depth {
	return depth{base: base, limit: max(base, min(4*base, 32))}
}

// targetLocked is the GETs to keep in flight for runs of runBytes on
// average; d.mu is held.
func (d *depth) targetLocked(runBytes int64) int {
	if d.bytes <= 0 || d.transfer <= 0 || runBytes <= 0 {
		return d.base
	}
	x := float64(d.transfer) * float64(runBytes) / float64(d.bytes)
	n := float64(d.base) * (1 + float64(d.minWait)/x)
	return min(d.limit, max(d.base, int(n+0.5)))
}

// add counts in and returns the workers to start for runs of runBytes on
// average, at most left.
func (d *depth) add(runBytes, left int64) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := int(min(int64(max(0, d.targetLocked(runBytes)-d.active)), max(0, left)))
	d.active += n
	return n
}

// stay says whether a worker goes on with another run: not while more
// are active than the target. A worker that ends counts itself out
// (leave); the check and the count-out are one step so that two workers
// do not both end for one too many.
func (d *depth) stay(runBytes int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.active > d.targetLocked(runBytes) {
		d.active--
		d.left++
		return false
	}
	return true
}

// leave counts out a worker that ends, unless stay already did.
func (d *depth) leave() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.left > 0 {
		d.left--
		return
	}
	d.active--
}

// observe adds one GET of n bytes: its first-byte wait and its transfer.
func (d *depth) observe(wait, transfer time.Duration, n int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.bytes == 0 || wait < d.minWait {
		d.minWait = wait
	}
	d.transfer += transfer
	d.bytes += n
}

// getClock times one GET of a warming: when it began, and when its first
// block (need bytes) was in. One goroutine reads the GET's body.
type getClock struct {
	need, got    int64
	began, first time.Time
}

// fetch wraps an object's fetch to time its GET.
func (g *getClock) fetch(inner FetchFunc) FetchFunc {
	return func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
		g.began = time.Now()
		body, err := inner(ctx, off, length)
		if err != nil {
			return nil, err
		}
		return &timedBody{ReadCloser: body, clock: g}, nil
	}
}

// split says how long a completed GET waited for its first byte and how
// long it then took to transfer its bytes. ok is false if no byte came.
func (g *getClock) split() (wait, transfer time.Duration, ok bool) {
	if g.first.IsZero() {
		return 0, 0, false
	}
	return g.first.Sub(g.began), time.Since(g.first), true
}

// timedBody notes when its clock's first byte has been read. It keeps
// the body's units (UnitReader) for the flights that receive from it.
type timedBody struct {
	io.ReadCloser
	clock *getClock
}

func (b *timedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if g := b.clock; g.first.IsZero() && n > 0 {
		g.first = time.Now()
	}
	return n, err
}

// UnitBytes implements UnitReader with the body's units, 0 if it has none.
func (b *timedBody) UnitBytes() int {
	if u, ok := b.ReadCloser.(UnitReader); ok {
		return u.UnitBytes()
	}
	return 0
}
