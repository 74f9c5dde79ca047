package restore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"warmstart/internal/memdev/fusedev"
)

// A remote lower's reads wait on an object store. The file device serves
// them for every restore attached to its generation and cannot tell whose
// a read is; a read the store leaves unanswered holds the VMM in its page
// fault (a FUSE request already handed to the server is not interrupted
// even by SIGKILL), and with it the stop, which waits for the VMM to exit
// and for the device's reads to drain. So the reads of a generation run
// under a context of their own, ended once no restore holding the
// generation is still running: each restore leaves when its stop begins
// (after a short grace, so that the last reads of a VM stopping cleanly
// complete) or at once when it failed. The store's fetches another
// generation's reads wait on go on (package chunkcache).

// stopReadGrace is how long the stop of a restore that got ready lets
// the reads in progress complete before it ends them: a healthy store
// answers well within it, and a stalled one costs no more than this.
const stopReadGrace = 500 * time.Millisecond

// generationReads is the context the remote reads of one device
// generation run under.
type generationReads struct {
	// gen is the generation number, once registered (0 before).
	gen    atomic.Uint64
	closed atomic.Bool

	mu     sync.Mutex
	live   int // restores holding the generation that have not begun stopping
	ctx    context.Context
	cancel context.CancelCauseFunc
}

func newGenerationReads() *generationReads {
	g := &generationReads{}
	g.ctx, g.cancel = context.WithCancelCause(context.Background())
	return g
}

// context is what a read starting now runs under.
func (g *generationReads) context() context.Context {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ctx
}

// join counts a restore attached to the generation. One attaching while
// the last holders stop (their reads ended) gets reads of its own.
func (g *generationReads) join() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.live == 0 && g.ctx.Err() != nil {
		g.ctx, g.cancel = context.WithCancelCause(context.Background())
	}
	g.live++
}

// leave uncounts a restore; the last one to leave ends the reads in
// progress and those to come with cause. It reports whether it did.
func (g *generationReads) leave(cause error) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.live--; g.live > 0 {
		return false
	}
	g.cancel(cause)
	return true
}

// generations are the reads of the remote lowers attached in this process,
// by generation number. attachMu makes an attach and its registration one
// step, so that a restore sharing a generation always finds its reads.
var generations = struct {
	attachMu sync.Mutex
	mu       sync.Mutex
	byGen    map[uint64]*generationReads
}{byGen: map[uint64]*generationReads{}}

// attachRemote attaches a file device through attach, whose lower, when it
// makes a new generation, is made by open with reads (newGenerationReads),
// and returns the device and its generation's reads, which the restore
// has joined; nil reads when the generation's lower was not made here.
func attachRemote(attach func(open func(*generationReads) (fusedev.Lower, error)) (*fusedev.Device, error),
	open func(*generationReads) (fusedev.Lower, error)) (*fusedev.Device, *generationReads, error) {
	generations.attachMu.Lock()
	defer generations.attachMu.Unlock()
	var made *generationReads
	dev, err := attach(func(reads *generationReads) (fusedev.Lower, error) {
		made = reads
		return open(reads)
	})
	if err != nil {
		return nil, nil, err
	}
	gen := dev.Generation()
	generations.mu.Lock()
	reads := generations.byGen[gen]
	if reads == nil && made != nil && !made.closed.Load() {
		reads = made
		reads.gen.Store(gen)
		generations.byGen[gen] = reads
	}
	generations.mu.Unlock()
	if reads != nil {
		reads.join()
	}
	return dev, reads, nil
}

// forget unregisters g once its lower is closed (its generation drained).
func (g *generationReads) forget() {
	g.closed.Store(true)
	gen := g.gen.Load()
	if gen == 0 {
		return // never registered: a lower that lost an attach race
	}
	generations.mu.Lock()
	defer generations.mu.Unlock()
	if generations.byGen[gen] == g {
		delete(generations.byGen, gen)
	}
}

// errStopped is the cause the reads of a generation end with when its
// last restore stops or fails: a cancellation, so no read of it counts as
// a failure of the store.
func errStopped(id string, why error) error {
	if why != nil {
		return fmt.Errorf("restore %s is over (%w): %w", id, why, context.Canceled)
	}
	return fmt.Errorf("restore %s is over: %w", id, context.Canceled)
}
