package s3

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// layerFaultEnv names the step at which a publish-layer-fault child kills
// itself (SIGKILL), as a crash there would.
const layerFaultEnv = "WARMSTART_TEST_LAYER_FAULT"

func childPublishLayerFault(ctx context.Context, repo repository.Repository) int {
	r, ok := repo.(*Repo)
	if !ok {
		return repotest.Report(errors.New("not an s3 repository"))
	}
	armed := os.Getenv(layerFaultEnv)
	r.layerFault = func(point string) {
		if point == armed {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	return repotest.ChildPublishLayer(ctx, repo)
}

// TestLayerPublishCrashAtEveryFaultPoint kills a process publishing a
// layer at each step: afterwards the child is wholly visible (killed after
// its record) or not at all, the parent's only dependent is a visible
// child (a dead publisher's lease expires), a new child publishes, and the
// chain deletes leaf first.
func TestLayerPublishCrashAtEveryFaultPoint(t *testing.T) {
	for _, point := range LayerFaultPoints {
		t.Run(point, func(t *testing.T) {
			r := chunkyRepo(t, "")
			r.leaseTTL = leaseTTLForTests
			base := repotest.PublishBase(t, r, 16*testChunkBytes, "")
			o := chunkyOptions(t, server.Endpoint, r.keys.prefix)
			o.LeaseTTL = leaseTTLForTests
			childID, mem := killLayerPublishAt(t, o, base, point)
			rec, err := r.Get(bg(), childID)
			visible := point == FaultLayerAfterRecord
			if visible != (err == nil) || (err != nil && !errors.Is(err, repository.ErrNotFound)) {
				t.Fatalf("after a crash at %s Get = %+v, %v; want visible=%v", point, rec, err, visible)
			}
			if visible {
				repotest.CheckLineage(t, r, repotest.Lineage{Record: rec, Memory: mem})
			}
			waitLeaseGone(t, r, childID)
			live, inProgress, err := r.Dependents(bg(), base.Record.ID)
			if err != nil || len(inProgress) != 0 || (len(live) == 1) != visible {
				t.Fatalf("after a crash at %s the parent's dependents are %v, %v (%v)", point, live, inProgress, err)
			}
			again := repotest.PublishChild(t, r, base, repotest.Change{Pages: []int64{3}}, "")
			repotest.CheckLineage(t, r, again)
			for _, id := range []string{again.Record.ID, childID, base.Record.ID} {
				if err := r.Delete(bg(), id); err != nil {
					t.Fatalf("delete %s: %v", id, err)
				}
			}
		})
	}
}

// leaseTTLForTests lets a killed publisher's lease expire within a test.
const leaseTTLForTests = time.Second

// waitLeaseGone waits until no lease on id counts as held.
func waitLeaseGone(t *testing.T, r *Repo, id string) {
	t.Helper()
	waitUntil(t, 10*time.Second, func() bool {
		held, err := r.LeaseHeld(bg(), id)
		return err == nil && !held
	})
}
