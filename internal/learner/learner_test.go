package learner

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"warmstart/internal/manifest"
	"warmstart/internal/refine"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/repotest"
)

const waitLimit = 30 * time.Second

// published is a snapshot on a real repository with a recorded manifest
// of pages 0..7, no lease held.
func published(t *testing.T) (*posixfs.Repo, repository.Record, *manifest.Manifest) {
	t.Helper()
	repo, err := posixfs.Open(filepath.Join(t.TempDir(), "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec, lease := repotest.Publish(t, repo, "")
	defer lease.End()
	var offs []int64
	for p := int64(0); p < 8; p++ {
		offs = append(offs, p*refine.PageBytes)
	}
	m, err := manifest.Build(rec.Layout, offs)
	if err != nil {
		t.Fatal(err)
	}
	data, err := manifest.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.AttachManifest(context.Background(), lease, data, nil); err != nil {
		t.Fatal(err)
	}
	return repo, rec, m
}

// missing is an observation of a restore of m that needed page p too.
func missing(m *manifest.Manifest, p int64) refine.Observation {
	obs := refine.FromEvents(m.Ranges, nil, time.Second, nil)
	obs.Demands = []refine.Demand{{Page: p, At: time.Millisecond, PlanIndex: -1}}
	obs.Untouched = nil
	return obs
}

// started is a learner on repo whose handled observations come out of
// the returned channel.
func started(t *testing.T, repo repository.Repository) (*Learner, <-chan error) {
	t.Helper()
	done := make(chan error, QueueLength+1)
	l := New(repo, nil, refine.Options{})
	l.applied = func(_ Observed, err error) { done <- err }
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return l, done
}

func next(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(waitLimit):
		t.Fatal("observation not handled")
	}
	return nil
}

// Two restores finishing at once are both learned from.
func TestConcurrentObservationsAreBothApplied(t *testing.T) {
	repo, rec, m := published(t)
	l, done := started(t, repo)
	for _, p := range []int64{10, 12} {
		if !l.Submit(Observed{SnapshotID: rec.ID, Observation: missing(m, p)}) {
			t.Fatal("submit refused")
		}
	}
	for range 2 {
		if err := next(t, done); err != nil {
			t.Fatal(err)
		}
	}
	st := stateOf(t, repo, rec.ID)
	pages := []int64{}
	for _, p := range st.Pages {
		pages = append(pages, p.Page)
	}
	if st.Restores != 2 || !slices.Contains(pages, 10) || !slices.Contains(pages, 12) {
		t.Fatalf("after two observations: %d restores, pages %v", st.Restores, pages)
	}
}

// A snapshot whose manifest is being recorded is left alone.
func TestSkipsWhileRecorded(t *testing.T) {
	repo, rec, m := published(t)
	recording, err := repo.LeaseExisting(context.Background(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer recording.End()
	l, done := started(t, repo)
	l.Submit(Observed{SnapshotID: rec.ID, Observation: missing(m, 10)})
	if err := next(t, done); err != nil {
		t.Fatal(err)
	}
	if got, _ := repo.Get(context.Background(), rec.ID); got.Refinement != nil {
		t.Fatalf("refined while a recording held the snapshot: %+v", got.Refinement)
	}
}

// hungRepository is a real repository whose store stops answering
// LeaseHeld until the caller gives up, as a hung NFS mount or a
// partitioned object store would.
type hungRepository struct {
	repository.Repository
	entered chan struct{}
}

func (h *hungRepository) LeaseHeld(ctx context.Context, _ string) (bool, error) {
	h.entered <- struct{}{}
	<-ctx.Done()
	return false, ctx.Err()
}

// A full queue drops observations, and Close gives up on a hung store
// when its context ends instead of waiting forever.
func TestBoundedQueueAndClose(t *testing.T) {
	repo, rec, m := published(t)
	hung := &hungRepository{Repository: repo, entered: make(chan struct{}, 1)}
	l := New(hung, nil, refine.Options{})
	o := Observed{SnapshotID: rec.ID, Observation: missing(m, 10)}
	l.Submit(o)
	<-hung.entered // the worker is stuck on the first
	for i := range QueueLength {
		if !l.Submit(o) {
			t.Fatalf("submit %d of %d refused", i, QueueLength)
		}
	}
	if l.Submit(o) {
		t.Fatal("submit past the queue's bound accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := l.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close on a hung store = %v, want the deadline", err)
	}
	if l.Submit(o) {
		t.Fatal("submit after Close accepted")
	}
}

func stateOf(t *testing.T, repo repository.Repository, id string) refine.State {
	t.Helper()
	res, err := repo.Resolve(context.Background(), id)
	if err != nil || res.Record.Refinement == nil {
		t.Fatalf("no refinement: %v", err)
	}
	st, err := readState(res.RefinementPath, *res.Record.Refinement)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

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
	l.r.ending <- struct{}{}
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

// Close gives up on a refinement stuck where its cancellation does not
// reach (the end of its lease on a store that does not answer) within
// AbandonAfter of its context's end, instead of waiting for it.
func TestCloseAbandonsARefinementThatIgnoresCancellation(t *testing.T) {
	repo, rec, m := published(t)
	stuck := &stuckEndRepository{Repository: repo, ending: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(func() { close(stuck.release) })
	l := New(stuck, nil, refine.Options{})
	l.Submit(Observed{SnapshotID: rec.ID, Observation: missing(m, 10)})
	select {
	case <-stuck.ending:
	case <-time.After(waitLimit):
		t.Fatal("the refinement never ended its lease")
	}
	const closeTimeout = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	closed := make(chan error, 1)
	t0 := time.Now()
	go func() { closed <- l.Close(ctx) }()
	limit := closeTimeout + AbandonAfter + 5*time.Second
	select {
	case err := <-closed:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Close with a stuck refinement = %v, want the deadline", err)
		}
		t.Logf("Close returned after %v: %v", time.Since(t0), err)
	case <-time.After(limit):
		t.Fatalf("Close still waits for the stuck refinement after %v", limit)
	}
}
