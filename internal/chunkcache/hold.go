package chunkcache

import "sync"

// Writes behind the stream. A block is served from memory until it is on
// disk, and writing it costs CPU (a file created, 1 MiB copied into the
// page cache, an fsync): on a small node that CPU is taken from the
// restore the block was fetched for, whose startup set is still
// streaming. So while a hold is taken (every warming holds one while it
// runs) the disk writers wait, and the blocks fetched meanwhile stay in
// memory, where reads take them with a copy instead of an open and a
// read of the file. The wait is bounded by the persist queue: once half
// of it is taken, the writers write whatever the holds, so the memory
// held stays what the queue always allowed, and a fetch never waits for a
// writer that waits for it.

// writeHolds is the state of the holds; its zero value has none.
type writeHolds struct {
	mu     sync.Mutex
	n      int
	quiet  chan struct{} // closed while n == 0; nil until the first hold
	closed bool          // the cache is closing: no hold counts any more
	// pressure wakes a waiting writer when the queue fills (one token).
	pressure chan struct{}
}

// holdWrites defers the disk writes until the returned release is called (it
// may be called more than once).
func (c *Cache) holdWrites() (release func()) {
	h := &c.holds
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return func() {}
	}
	if h.n == 0 {
		h.quiet = make(chan struct{})
	}
	h.n++
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.closed {
				return
			}
			if h.n--; h.n == 0 {
				close(h.quiet)
			}
		})
	}
}

// releaseAllWrites ends every hold, for Close: the writers then write
// what is left.
func (c *Cache) releaseAllWrites() {
	h := &c.holds
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n > 0 {
		close(h.quiet)
	}
	h.n, h.closed = 0, true
}

// awaitWriteTurn waits until no hold is taken or the persist queue is
// half full.
func (c *Cache) awaitWriteTurn() {
	h := &c.holds
	for len(c.persistQ) < cap(c.persistQ)/2 {
		h.mu.Lock()
		quiet, held := h.quiet, h.n > 0
		h.mu.Unlock()
		if !held {
			return
		}
		select {
		case <-quiet:
			return
		case <-h.pressure:
		}
	}
}

// noteQueued wakes a waiting writer when the persist queue is half full.
func (c *Cache) noteQueued() {
	if len(c.persistQ) >= cap(c.persistQ)/2 {
		select {
		case c.holds.pressure <- struct{}{}:
		default:
		}
	}
}
