package s3

import (
	"context"
	"sync"

	"golang.org/x/time/rate"

	"warmstart/internal/chunkcache"
	"warmstart/internal/ratelimit"
)

// The background fill: once a restore is ready (its startup set is in the
// node cache), the rest of that snapshot's memory follows at low priority,
// so the next restore on the node is warm. It is bounded (FillOptions: workers and a
// byte rate) and yields: no fill worker starts a fetch while a startup set
// of any restore on this node is still streaming; demand misses never wait
// for it (they join its fetch of a block, as any other).

// Fill defaults.
const (
	DefaultFillConcurrency = 2
	DefaultFillBitsPerSec  = 200_000_000
)

// FillOptions bound the background fill. The zero value is the default:
// on, DefaultFillConcurrency workers, DefaultFillBitsPerSec.
type FillOptions struct {
	// Disabled turns the fill off.
	Disabled bool
	// Concurrency bounds the fill's fetches in flight.
	Concurrency int
	// BitsPerSec bounds the bytes the fill fetches per second (times 8).
	BitsPerSec int64
}

// filler runs the fills of one repository.
type filler struct {
	cache *chunkcache.Cache
	o     FillOptions
	limit *ratelimit.Limiter
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup // every goroutine of the filler
	fills sync.WaitGroup // the fills running

	mu      sync.Mutex
	closed  bool            // set by close: no goroutine starts after it
	running map[string]bool // object ids being filled
	streams int             // startup sets streaming now
	quiet   chan struct{}   // closed while streams == 0
}

func newFiller(c *chunkcache.Cache, o FillOptions) *filler {
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultFillConcurrency
	}
	if o.BitsPerSec <= 0 {
		o.BitsPerSec = DefaultFillBitsPerSec
	}
	bytesPerSec := float64(o.BitsPerSec) / 8
	f := &filler{cache: c, o: o, running: map[string]bool{}, quiet: make(chan struct{}),
		limit: ratelimit.New(rate.Limit(bytesPerSec), int(max(c.BlockBytes(), int64(bytesPerSec)/10)))}
	close(f.quiet)
	f.ctx, f.stop = context.WithCancel(context.Background())
	return f
}

// wait waits for the fills running now to end.
func (f *filler) wait() { f.fills.Wait() }

// close stops every fill and waits for its fetches.
func (f *filler) close() {
	// Under mu, so that no start or streaming adds to wg once Wait began.
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.stop()
	f.wg.Wait()
}

// streaming counts w as a streaming startup set until it ends.
func (f *filler) streaming(w *chunkcache.Warming) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	if f.streams == 0 {
		f.quiet = make(chan struct{})
	}
	f.streams++
	f.wg.Go(func() {
		select {
		case <-w.Done():
		case <-f.ctx.Done():
		}
		f.mu.Lock()
		if f.streams--; f.streams == 0 {
			close(f.quiet)
		}
		f.mu.Unlock()
	})
}

// start fills obj unless the fill is off or already filling it.
func (f *filler) start(obj chunkcache.Object) {
	if f.o.Disabled || f.ctx.Err() != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || f.running[obj.ID] {
		return
	}
	f.running[obj.ID] = true
	f.fills.Add(1)
	f.wg.Go(func() {
		defer f.fills.Done()
		defer func() {
			f.mu.Lock()
			delete(f.running, obj.ID)
			f.mu.Unlock()
		}()
		f.fill(obj)
	})
}

// fill loads every block of obj not cached yet, with bounded workers,
// until done, stopped, or the cache has no free room left: a fill uses
// free space only, never evicting what restores cached, and holds no pin.
func (f *filler) fill(obj chunkcache.Object) {
	// One object's failure (the store is down, its snapshot deleted)
	// ends its fill, not the others'.
	ctx, cancel := context.WithCancel(asFill(f.ctx))
	defer cancel()
	block := f.cache.BlockBytes()
	blocks := (obj.Size + block - 1) / block
	next := make(chan int64)
	var wg sync.WaitGroup
	for range f.o.Concurrency {
		wg.Go(func() {
			for idx := range next {
				n := min(block, obj.Size-idx*block)
				if f.waitTurn(ctx, n) != nil {
					continue
				}
				if f.cache.FreeBytes() < n || f.cache.Load(ctx, obj, idx*block, n) != nil {
					cancel() // full, or failing: demand reads will say why
				}
			}
		})
	}
	for idx := int64(0); idx < blocks && ctx.Err() == nil; idx++ {
		if !f.cache.Cached(obj.ID, idx) {
			select {
			case next <- idx:
			case <-ctx.Done():
			}
		}
	}
	close(next)
	wg.Wait()
}

// waitTurn waits until no startup set is streaming and the rate allows n
// more bytes.
func (f *filler) waitTurn(ctx context.Context, n int64) error {
	f.mu.Lock()
	quiet := f.quiet
	f.mu.Unlock()
	select {
	case <-quiet:
	case <-ctx.Done():
		return ctx.Err()
	}
	return f.limit.Wait(ctx, int(min(n, int64(f.limit.Burst()))))
}
