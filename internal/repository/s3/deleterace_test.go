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
		nodeA := chunkyRepo(t, "")
		nodeB := chunkyRepo(t, nodeA.keys.prefix)
		base := repotest.PublishBase(t, nodeA, 8*testChunkBytes, "")
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
		nodeA := chunkyRepo(t, "")
		nodeB := chunkyRepo(t, nodeA.keys.prefix)
		base := repotest.PublishBase(t, nodeA, 8*testChunkBytes, "")
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
