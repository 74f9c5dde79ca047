package s3

import (
	"context"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestFailedFlattenLeavesAConcurrentFlattensLayer: a layer's name is its
// content's (layers.LayerName), so two nodes flattening one snapshot at
// once store the same objects. One that fails (its caller gave up) after
// storing them, while the other has stored them and not yet written its
// record, must leave them: the other's record names them next, and the
// snapshot must read back whole.
func TestFailedFlattenLeavesAConcurrentFlattensLayer(t *testing.T) {
	nodeA, nodeB, base := twoNodesOverABase(t)
	mid := repotest.PublishChild(t, nodeA, base, repotest.Change{Pages: []int64{1, 5}}, "")
	leaf := repotest.PublishChild(t, nodeA, mid, repotest.Change{Pages: []int64{2, 5, 30}}, "")
	flatten := func(node *Repo, ctx context.Context) (repository.Record, error) {
		lease, err := node.LeaseExisting(bg(), leaf.Record.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer lease.End()
		return node.ReplaceMemory(ctx, lease, repository.ReplaceMemoryRequest{Expect: leaf.Record, Layer: mergedLayer(t, base.Memory, leaf.Memory)})
	}
	var failedErr error
	nodeB.layerFault = func(p string) {
		if p != FaultReplaceBeforeRecord {
			return
		}
		nodeB.layerFault = nil
		// Node A's flatten of the same snapshot stores the same layer, and
		// its caller gives up right before its record.
		ctx, cancel := context.WithCancel(bg())
		defer cancel()
		nodeA.layerFault = func(p string) {
			if p == FaultReplaceBeforeRecord {
				cancel()
			}
		}
		_, failedErr = flatten(nodeA, ctx)
	}
	flat, err := flatten(nodeB, bg())
	if failedErr == nil {
		t.Fatal("the flatten whose caller gave up before its record succeeded")
	}
	if err != nil {
		t.Fatalf("the other flatten: %v", err)
	}
	if flat.Depth() != 1 {
		t.Fatalf("flattened record of depth %d, want 1", flat.Depth())
	}
	readsBack(t, nodeA.keys.prefix, leaf.Record.ID, repotest.SHA256Hex(leaf.Memory))
}
