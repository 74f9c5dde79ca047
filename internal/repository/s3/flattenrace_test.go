package s3

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestFlattenRacesPauseOnAnotherNode: node B flattens the parent whole;
// after B found no dependents and before it writes the new record, node A
// publishes a child over the parent's record as it read it (naming the
// parent's diff layer). Whichever wins, no child names a layer that is
// gone: the child reads back as its memory, also after a sweep and a
// garbage collection, and so does the parent.
func TestFlattenRacesPauseOnAnotherNode(t *testing.T) {
	nodeA := chunkyRepo(t, "")
	nodeB := chunkyRepo(t, nodeA.keys.prefix)
	base := repotest.PublishBase(t, nodeA, 8*testChunkBytes, "")
	mid := repotest.PublishChild(t, nodeA, base, repotest.Change{Pages: []int64{1, 5}}, "")
	memPath := filepath.Join(t.TempDir(), "mid.mem")
	if err := os.WriteFile(memPath, mid.Memory, 0o600); err != nil {
		t.Fatal(err)
	}
	built, childMem := repotest.BuildLayer(t, mid.Memory, repotest.Change{Pages: []int64{2, 5}})
	req := repotest.LayerRequest(t, mid.Record, built, "")
	var child repository.Record
	var pubErr error
	tried := false
	nodeB.layerFault = func(p string) {
		if p != FaultReplaceAfterCheck || tried {
			return
		}
		tried = true
		lease, err := nodeA.BeginCapture(bg())
		if err != nil {
			t.Error(err)
			return
		}
		defer lease.End()
		child, pubErr = nodeA.PublishLayer(bg(), lease, req)
	}
	lease, err := nodeB.LeaseExisting(bg(), mid.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, flatErr := nodeB.ReplaceMemory(bg(), lease, repository.ReplaceMemoryRequest{Expect: mid.Record, MemoryPath: memPath})
	lease.End()
	if !tried {
		t.Fatal("the flatten did not reach its fault point")
	}
	if flatErr != nil && pubErr != nil {
		t.Fatalf("both failed: flatten %v; publish %v", flatErr, pubErr)
	}
	readsBack(t, nodeA.keys.prefix, mid.Record.ID, repotest.SHA256Hex(mid.Memory))
	if pubErr == nil {
		readsBack(t, nodeA.keys.prefix, child.ID, repotest.SHA256Hex(childMem))
		// The layer the child names outlives a sweep and a collection.
		if err := nodeB.Sweep(bg()); err != nil {
			t.Fatal(err)
		}
		if _, err := nodeB.CollectGarbage(bg()); err != nil {
			t.Fatal(err)
		}
		readsBack(t, nodeA.keys.prefix, child.ID, repotest.SHA256Hex(childMem))
	} else if !errors.Is(pubErr, repository.ErrStale) {
		t.Fatalf("the publish over a parent being flattened: %v, want ErrStale", pubErr)
	}
}
