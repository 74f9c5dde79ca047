package chunkcache

import (
	"sync/atomic"
	"time"
)

// FetchObserver is told of every ranged GET the cache issues (demand and
// prefetch), once it has returned or failed, with its latency to the
// response (not to the end of the body). It must be quick.
type FetchObserver func(took time.Duration, err error)

// fetchObserver holds the cache's FetchObserver, set once the cache is open.
type fetchObserver struct{ p atomic.Pointer[FetchObserver] }

func (o *fetchObserver) observe(took time.Duration, err error) {
	if f := o.p.Load(); f != nil {
		(*f)(took, err)
	}
}

// ObserveFetches makes o the cache's FetchObserver (nil removes it). The
// counters of Stats need no observer.
func (c *Cache) ObserveFetches(o FetchObserver) {
	if o == nil {
		c.onFetch.p.Store(nil)
		return
	}
	c.onFetch.p.Store(&o)
}
