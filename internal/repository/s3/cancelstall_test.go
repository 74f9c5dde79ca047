package s3

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/repository"
)

// TestCancelledPublishOnAStalledStore: the store stops answering (SIGSTOP:
// it keeps its connections and never answers) while a publish uploads its
// chunks, and the publish's caller gives up (a daemon shutting down). The
// publish returns within cleanupAfterCancel of that and a little more,
// not after the minute its clean-up would go on trying (what it leaves
// is snapshot gc's); once the store answers again no record of it is
// visible.
func TestCancelledPublishOnAStalledStore(t *testing.T) {
	own, r := ownChunkyRepo(t)
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg())
	defer cancel()
	pid := own.PID()
	resume := func() { syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(resume)
	in := chunkyInputs(t, 47)
	req := in.Request("stalled")
	var once sync.Once
	var cancelled time.Time
	req.Progress = func(p repository.ImportProgress) {
		if p.Artifact == repository.MemoryFileName && p.DoneBytes >= 3*testChunkBytes {
			once.Do(func() {
				if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
					t.Error(err)
				}
				cancelled = time.Now()
				cancel()
			})
		}
	}
	_, err = r.Publish(ctx, lease, req)
	took := time.Since(cancelled)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("publish cancelled on a stalled store: %v, want context.Canceled", err)
	}
	if limit := cleanupAfterCancel + 3*time.Second; took > limit {
		t.Fatalf("publish returned %v after its context was cancelled, want within %v: %v", took, limit, err)
	}
	t.Logf("the cancelled publish returned %v after the cancel: %v", took.Round(time.Millisecond), err)
	resume()
	if _, err := r.Get(bg(), lease.SnapshotID()); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("Get of the cancelled publish: %v, want ErrNotFound", err)
	}
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
}
