package s3

import (
	"errors"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestParentDeletedWhilePauseInFlight: node B deletes the parent at each
// step of a child's layer publish on node A. From the child's marker on,
// every delete is refused (the marker is in progress, then live), the
// child is committed over a parent that is still there, and the chain
// reads back right; the delete in the marker's window itself is
// TestDeleteRacesPauseOnAnotherNode's.
func TestParentDeletedWhilePauseInFlight(t *testing.T) {
	for _, point := range LayerFaultPoints {
		t.Run(point, func(t *testing.T) {
			nodeA, nodeB, base := twoNodesOverABase(t)
			var delErr error
			tried := false
			nodeA.layerFault = func(p string) {
				if p == point && !tried {
					tried = true
					delErr = nodeB.Delete(bg(), base.Record.ID)
				}
			}
			child := repotest.PublishChild(t, nodeA, base, repotest.Change{Pages: []int64{1, 5}}, "")
			if !tried || !errors.Is(delErr, repository.ErrHasDependents) {
				t.Fatalf("delete of the parent at %s: %v, want it refused", point, delErr)
			}
			if rec, err := nodeB.Get(bg(), base.Record.ID); err != nil || rec.DeletingSince != nil {
				t.Fatalf("the parent after the refused delete: %+v, %v", rec, err)
			}
			repotest.CheckLineage(t, chunkyRepo(t, nodeA.keys.prefix), child)
		})
	}
}

// TestParentQuarantinedWhilePauseInFlight: node B's sweep moves the
// parent's (damaged) record to the quarantine while node A publishes a
// child over it. Quarantined before A reads the owner, the publish fails
// and leaves nothing: no child record, no marker at the parent. Later (the
// record damaged after A checked it, as it may be at any time after the
// child is published), the child is committed and its chain still reads
// right, since the quarantine moves the record and not its layers, and
// the child's live marker keeps a delete of the quarantined parent from
// removing them.
func TestParentQuarantinedWhilePauseInFlight(t *testing.T) {
	quarantine := func(t *testing.T, r *Repo, id string) {
		flipObject(t, r, r.keys.record(id))
		if err := r.Sweep(bg()); err != nil {
			t.Error(err)
		}
		if q, err := r.exists(bg(), r.keys.quarantinedRecord(id)); err != nil || !q {
			t.Errorf("parent %s not quarantined: %v", id, err)
		}
	}
	t.Run("before the owner read", func(t *testing.T) {
		nodeA, nodeB, base := twoNodesOverABase(t)
		built, _ := repotest.BuildLayer(t, base.Memory, repotest.Change{Pages: []int64{1}})
		nodeA.afterMarker = func(string) { quarantine(t, nodeB, base.Record.ID) }
		lease := beginCapture(t, nodeA)
		if _, err := nodeA.PublishLayer(bg(), lease, repotest.LayerRequest(t, base.Record, built, "")); err == nil {
			t.Fatal("a child was published over a quarantined parent")
		}
		if _, err := nodeB.Get(bg(), lease.SnapshotID()); !errors.Is(err, repository.ErrNotFound) {
			t.Fatalf("the failed child: %v, want not found", err)
		}
		if markers, err := nodeB.list(bg(), nodeB.keys.dependentsOf(base.Record.ID)); err != nil || len(markers) != 0 {
			t.Fatalf("markers at the quarantined parent after the failed publish: %d (%v), want none", len(markers), err)
		}
	})
	for _, point := range []string{FaultLayerAfterArtifacts, FaultLayerBeforeRecord} {
		t.Run("at "+point, func(t *testing.T) {
			nodeA, nodeB, base := twoNodesOverABase(t)
			nodeA.layerFault = func(p string) {
				if p == point {
					quarantine(t, nodeB, base.Record.ID)
				}
			}
			child := repotest.PublishChild(t, nodeA, base, repotest.Change{Pages: []int64{1, 5}}, "")
			readsBack(t, nodeA.keys.prefix, child.Record.ID, repotest.SHA256Hex(child.Memory))
			if err := nodeB.Delete(bg(), base.Record.ID); !errors.Is(err, repository.ErrHasDependents) {
				t.Fatalf("delete of the quarantined parent under a live child: %v, want it refused", err)
			}
			readsBack(t, nodeA.keys.prefix, child.Record.ID, repotest.SHA256Hex(child.Memory))
		})
	}
}
