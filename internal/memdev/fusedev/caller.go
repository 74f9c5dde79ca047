package fusedev

import (
	"context"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"warmstart/internal/memdev"
)

// A FUSE request names the calling thread, not its process, so telling a
// guest's fault (another process) from this process's own read through
// the device file takes a look at /proc/self/task. That lookup costs a few
// microseconds, against a demand read the server answers in about 25, and
// a guest that faults page by page asks it thousands of times a restore;
// so answers are remembered.
//
// Our own threads are remembered for good: the Go runtime does not let its
// threads exit. Another process's thread is remembered for foreignTTL
// only: its id can be reused once it exits, by a thread of ours among
// others. Reuse needs the kernel to cycle through its whole pid space
// first, so within a second a stale answer does not happen in practice,
// and the worst it could do is count one read of ours as demand (no byte
// served changes).
const (
	foreignTTL = time.Second
	// maxForeign bounds the remembered foreign threads; expired ones are
	// dropped when it is reached.
	maxForeign = 4096
)

// callers classifies FUSE callers, remembering the answers.
type callers struct {
	isOwn func(tid uint32) bool
	now   func() time.Time

	mu      sync.Mutex
	own     map[uint32]bool
	foreign map[uint32]time.Time // expiry
}

func newCallers(isOwn func(tid uint32) bool, now func() time.Time) *callers {
	return &callers{isOwn: isOwn, now: now, own: map[uint32]bool{}, foreign: map[uint32]time.Time{}}
}

// processCallers classifies the callers of every mount of this process.
var processCallers = newCallers(isOwnThread, time.Now)

func isOwnThread(tid uint32) bool {
	_, err := os.Stat("/proc/self/task/" + strconv.FormatUint(uint64(tid), 10))
	return err == nil
}

// requestKind classifies a read request by its caller: this process's
// threads read for prefetch, any other process is the guest.
func requestKind(ctx context.Context) memdev.Kind {
	caller, ok := fuse.FromContext(ctx)
	if !ok {
		return memdev.Demand
	}
	return processCallers.kind(caller.Pid)
}

func (c *callers) kind(tid uint32) memdev.Kind {
	if k, ok := c.remembered(tid); ok {
		return k
	}
	own := c.isOwn(tid)
	c.mu.Lock()
	defer c.mu.Unlock()
	if own {
		c.own[tid] = true
		return memdev.Prefetch
	}
	if len(c.foreign) >= maxForeign {
		c.pruneLocked()
	}
	c.foreign[tid] = c.now().Add(foreignTTL)
	return memdev.Demand
}

func (c *callers) remembered(tid uint32) (memdev.Kind, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.own[tid] {
		return memdev.Prefetch, true
	}
	if until, ok := c.foreign[tid]; ok && c.now().Before(until) {
		return memdev.Demand, true
	}
	return 0, false
}

// pruneLocked drops the expired foreign threads, or all of them when none
// has expired (a burst of short-lived callers).
func (c *callers) pruneLocked() {
	now := c.now()
	for tid, until := range c.foreign {
		if !now.Before(until) {
			delete(c.foreign, tid)
		}
	}
	if len(c.foreign) >= maxForeign {
		clear(c.foreign)
	}
}
