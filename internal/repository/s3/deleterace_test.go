package s3

import (
	"errors"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestDeleteRacesPauseOnAnotherNode runs a delete of a parent on node A
// inside each window of a layer publish of its child on node B, and the
// publish inside the delete's window: each side writes, then reads the
// other's write, so either the delete is refused or the publish fails
// naming the delete; never is a child committed over a removed owner.
func TestDeleteRacesPauseOnAnotherNode(t *testing.T) {
	t.Run("delete between the marker and the owner read", func(t *testing.T) {
		nodeA, nodeB, base := twoNodesOverABase(t)
		var delErr error
		nodeB.afterMarker = func(string) { delErr = nodeA.Delete(bg(), base.Record.ID) }
		child := repotest.PublishChild(t, nodeB, base, repotest.Change{Pages: []int64{1}}, "")
		if !errors.Is(delErr, repository.ErrHasDependents) {
			t.Fatalf("delete while the child registered = %v, want it refused", delErr)
		}
		repotest.CheckLineage(t, nodeA, child)
		if rec, err := nodeA.Get(bg(), base.Record.ID); err != nil || rec.DeletingSince != nil {
			t.Fatalf("the parent after the refused delete: %+v, %v", rec, err)
		}
	})
	t.Run("publish between the deleting mark and the marker list", func(t *testing.T) {
		nodeA, nodeB, base := twoNodesOverABase(t)
		built, _ := repotest.BuildLayer(t, base.Memory, repotest.Change{Pages: []int64{1}})
		var pubErr error
		var childID string
		nodeA.afterMarkDeleting = func() {
			lease, err := nodeB.BeginCapture(bg())
			if err != nil {
				t.Error(err)
				return
			}
			defer lease.End()
			childID = lease.SnapshotID()
			_, pubErr = nodeB.PublishLayer(bg(), lease, repotest.LayerRequest(t, base.Record, built, ""))
		}
		if err := nodeA.Delete(bg(), base.Record.ID); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if pubErr == nil || !strings.Contains(pubErr.Error(), "being deleted") {
			t.Fatalf("publish during the delete = %v, want a failure naming the delete", pubErr)
		}
		if _, err := nodeA.Get(bg(), childID); !errors.Is(err, repository.ErrNotFound) {
			t.Fatalf("the failed child: %v", err)
		}
		if _, err := nodeA.Get(bg(), base.Record.ID); !errors.Is(err, repository.ErrNotFound) {
			t.Fatalf("the deleted parent: %v", err)
		}
	})
}

// TestDeleteOfARecordChangedUnderIt: a manifest attached by another node
// between a delete's read of the record and its deleting mark makes the
// mark's etag stale; the delete reads the record again and goes on (it
// failed with "the record changed while the delete began" in the
// cross-process attach-racing-delete test).
func TestDeleteOfARecordChangedUnderIt(t *testing.T) {
	nodeA := chunkyRepo(t, "")
	nodeB := chunkyRepo(t, nodeA.keys.prefix)
	rec, lease := repotest.Publish(t, nodeB, "changed-under-delete")
	defer lease.End()
	attached := 0
	nodeA.beforeMarkDeleting = func() {
		if attached++; attached == 1 {
			if _, err := nodeB.AttachManifest(bg(), lease, repotest.ManifestBytes(t, 64), nil); err != nil {
				t.Errorf("attach during the delete: %v", err)
			}
		}
	}
	if err := nodeA.Delete(bg(), rec.ID); err != nil {
		t.Fatalf("delete of a record changed under it: %v", err)
	}
	if attached < 2 {
		t.Fatalf("the delete read the record %d times, want it read again after the change", attached)
	}
	if _, err := nodeA.Get(bg(), rec.ID); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("after the delete: %v, want not found", err)
	}
}
