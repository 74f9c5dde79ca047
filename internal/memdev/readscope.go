package memdev

import (
	"context"
	"sync"
)

// A lower that waits on an object store serves reads for every restore
// holding its generation, and a device cannot tell whose a read is. A read
// the store leaves unanswered holds the VMM in its page fault (a FUSE
// request already handed to the server is not interrupted even by
// SIGKILL), and with it the stop, which waits for the VMM to exit and for
// the device's reads to drain. So the reads of a generation run under a
// context of their own, ended once no restore holding the generation is
// still running: each leaves when its stop begins (after a grace the
// restore chooses) or at once when it failed.

// ReadScope is the context the reads of one lower run under. It is shared
// by the restores that hold the lower. The last one to leave ends it, with
// a cause. One that joins after that gets a fresh context.
type ReadScope struct {
	mu          sync.Mutex
	live        int // holders that have joined and not left
	ctx         context.Context
	cancel      context.CancelCauseFunc
	cancellable bool // the lower's reads take the context (ContextReaderAt)
}

// NewReadScope returns a scope nobody has joined yet.
func NewReadScope() *ReadScope {
	s := &ReadScope{}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	return s
}

// Context is what a read starting now runs under.
func (s *ReadScope) Context() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctx
}

// Join counts a holder. One joining while the last holders have left
// (their reads ended) gets reads of its own.
func (s *ReadScope) Join() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live == 0 && s.ctx.Err() != nil {
		s.ctx, s.cancel = context.WithCancelCause(context.Background())
	}
	s.live++
}

// Leave uncounts a holder. The last one ends the reads in progress and
// those to come, with cause. It reports true only when it ended reads that
// can end (the lower is a ContextReaderAt): a local file's reads are never
// "ended".
func (s *ReadScope) Leave(cause error) (ended bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live--; s.live > 0 {
		return false
	}
	s.live = 0
	s.cancel(cause)
	return s.cancellable
}

// bind marks the scope as one whose reads take its context.
func (s *ReadScope) bind() {
	s.mu.Lock()
	s.cancellable = true
	s.mu.Unlock()
}
