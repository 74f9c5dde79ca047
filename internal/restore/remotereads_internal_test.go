package restore

import (
	"context"
	"errors"
	"testing"
)

// TestGenerationReadsEndWithTheirLastRestore: the remote reads of a device
// generation shared by two restores go on when one of them stops, end
// with the cause of the last one to stop, and a restore attaching to the
// generation while it drains reads under a context of its own.
func TestGenerationReadsEndWithTheirLastRestore(t *testing.T) {
	g := newGenerationReads()
	g.join()
	g.join()
	ctx := g.context()
	first, last := errors.New("restore A is over"), errStopped("B", errors.New("the store stalled"))
	if g.leave(first) {
		t.Fatal("the first of two restores to stop ended the reads")
	}
	if ctx.Err() != nil {
		t.Fatalf("the reads of the restore still running ended: %v", context.Cause(ctx))
	}
	if !g.leave(last) {
		t.Fatal("the last restore to stop did not end the reads")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, last) || !errors.Is(cause, context.Canceled) {
		t.Fatalf("the reads ended with %v, want %v (a cancellation)", cause, last)
	}
	if got := g.context(); got.Err() == nil {
		t.Fatal("a read starting after the last restore stopped would not end")
	}
	g.join()
	if got := g.context(); got.Err() != nil {
		t.Fatalf("a restore attaching after the others stopped reads under an ended context: %v", context.Cause(got))
	}
}
