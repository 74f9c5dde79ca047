package node_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/learner"
	"warmstart/internal/node"
	"warmstart/internal/refine"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/vmm/replay"
)

// stuckEndRepository is a real repository whose leases' End does not
// return until released, whatever the caller's context: as an S3 lease's
// release (it has no context) does while the store does not answer.
type stuckEndRepository struct {
	repository.Repository
	ending  chan struct{} // told when an End begins
	release chan struct{} // closed to let End return
}

type stuckLease struct {
	repository.Lease
	r *stuckEndRepository
}

func (l stuckLease) End() error {
	select {
	case l.r.ending <- struct{}{}:
	default:
	}
	<-l.r.release
	return l.Lease.End()
}

func (h *stuckEndRepository) LeaseExisting(ctx context.Context, id string) (repository.Lease, error) {
	lz, err := h.Repository.LeaseExisting(ctx, id)
	if err != nil {
		return nil, err
	}
	return stuckLease{Lease: lz, r: h}, nil
}

// TestCloseRunsEveryStepWhenOneFails: the refinement is stuck where its
// cancellation does not reach, so closing it fails, after
// LearnerCloseBound at most; the tracing mount, the FUSE mount and the
// runtime directory are still closed after it, each reported with its
// own outcome, and nothing stays mounted.
func TestCloseRunsEveryStepWhenOneFails(t *testing.T) {
	needFUSE(t)
	dir, repo := nodeDir(t, posixfs.Options{})
	rec, lease := repotest.Publish(t, repo, "")
	lease.End()
	stuck := &stuckEndRepository{Repository: repo, ending: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(func() { close(stuck.release) })
	cfg := config.Default()
	cfg.Manifest.Refine = true
	run := filepath.Join(dir, "run")
	n, err := node.Open(context.Background(), node.Options{Config: cfg, Repository: stuck,
		VMM: &replay.VMM{TracePath: "unused"}, RuntimeDir: run, RemoveRuntimeDir: true})
	if err != nil {
		t.Fatal(err)
	}
	n.Learner.Submit(learner.Observed{SnapshotID: rec.ID, Observation: refine.Observation{}})
	select {
	case <-stuck.ending:
	case <-time.After(time.Minute):
		t.Fatal("the refinement never ended its lease")
	}
	type outcome struct {
		step string
		err  error
	}
	var got []outcome
	closed := make(chan struct{})
	t0 := time.Now()
	go func() {
		defer close(closed)
		n.CloseEach(func(step string, err error) { got = append(got, outcome{step, err}) })
	}()
	limit := node.LearnerCloseBound + 10*time.Second
	select {
	case <-closed:
	case <-time.After(limit):
		t.Fatalf("Close still runs after %v", limit)
	}
	t.Logf("Close took %v: %v", time.Since(t0), got)
	steps := make([]string, len(got))
	for i, o := range got {
		steps[i] = o.step
	}
	want := []string{node.StepRefinement, node.StepTracingMount, node.StepServingMount, node.StepRuntimeDir}
	if !slices.Equal(steps, want) {
		t.Fatalf("Close reported steps %v, want %v", steps, want)
	}
	if got[0].err == nil {
		t.Error("closing the stuck refinement reported no error")
	}
	for _, o := range got[1:] {
		if o.err != nil {
			t.Errorf("close %s: %v", o.step, o.err)
		}
	}
	if ms := mountsUnder(t, run); len(ms) != 0 {
		t.Errorf("still mounted after Close: %v", ms)
	}
}
