package s3

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestStoreStoppedMidLayerPublish: the store stops once a pause's layer
// publish has stored its dependent markers and VM state (and comes back
// while the failed publish cleans up). The publish fails; once it has
// returned nothing of the child is left, the parent has no dependent,
// its keys are as before, and a later child publishes and reads back.
func TestStoreStoppedMidLayerPublish(t *testing.T) {
	own, r := ownChunkyRepo(t)
	base := repotest.PublishBase(t, r, 16*testChunkBytes, "")
	before := snapshotKeys(t, r)
	built, _ := repotest.BuildLayer(t, base.Memory, repotest.Change{Pages: []int64{1, 5, 40}, Zero: []int64{2}})
	req := repotest.LayerRequest(t, base.Record, built, "kid")
	var stopOnce, restartOnce sync.Once
	r.layerFault = func(point string) {
		if point == FaultLayerAfterVMState {
			stopOnce.Do(func() { own.Stop() })
		}
	}
	var failedCleanups int
	r.cleanupRetry = func(err error) {
		failedCleanups++
		restartOnce.Do(func() {
			if err := own.Start(); err != nil {
				t.Error(err)
			}
		})
	}
	lease := beginCapture(t, r)
	ctx, cancel := context.WithTimeout(bg(), 2*time.Minute)
	defer cancel()
	if _, err := r.PublishLayer(ctx, lease, req); err == nil {
		t.Fatal("a layer publish succeeded with the store stopped")
	} else {
		t.Logf("layer publish with the store stopped: %v (%d cleanups found it stopped)", err, failedCleanups)
	}
	restartOnce.Do(func() {
		if err := own.Start(); err != nil {
			t.Fatal(err)
		}
	})
	r.layerFault = nil
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	if left := snapshotKeys(t, r); !slices.Equal(left, before) {
		t.Fatalf("the failed layer publish left keys: %v, before %v", left, before)
	}
	if _, err := r.Get(bg(), lease.SnapshotID()); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("Get of the failed child: %v", err)
	}
	live, inProgress, err := r.Dependents(bg(), base.Record.ID)
	if err != nil || len(live)+len(inProgress) != 0 {
		t.Fatalf("the parent's dependents after the failed publish: %v, %v (%v)", live, inProgress, err)
	}
	again := repotest.PublishChild(t, r, base, repotest.Change{Pages: []int64{3}}, "kid")
	repotest.CheckLineage(t, r, again)
}
