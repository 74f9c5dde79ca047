package s3

import (
	"math/rand/v2"
	"testing"
	"time"

	"warmstart/internal/layers"
	"warmstart/internal/repository/repotest"
)

// TestGCKeepsEveryLayerOfAChain: chunks of the base and of every child's
// layer are live while the chain is, whatever the grace; once the child
// is deleted and its grace has passed, its layer's own chunks go and the
// base still reads right.
func TestGCKeepsEveryLayerOfAChain(t *testing.T) {
	r := chunkyRepo(t, "")
	r.chunkGrace = time.Nanosecond
	base := repotest.PublishBase(t, r, 64*testChunkBytes/4, "")
	pages := int64(len(base.Memory)) / layers.PageBytes
	rng := rand.New(rand.NewPCG(7, 8))
	child := repotest.PublishChild(t, r, base, repotest.RandomChange(rng, pages, int(pages/3)), "")
	grand := repotest.PublishChild(t, r, child, repotest.RandomChange(rng, pages, int(pages/3)), "")
	if child.Record.MemoryLayers[1].Format != "chunks-v1" || child.Record.MemoryLayers[1].Chunks.StoredBytes == 0 {
		t.Fatalf("child's layer is not stored as chunks: %+v", child.Record.MemoryLayers[1])
	}
	if _, err := r.CollectGarbage(bg()); err != nil {
		t.Fatal(err)
	}
	for _, l := range []repotest.Lineage{base, child, grand} {
		readsBack(t, r.keys.prefix, l.Record.ID, repotest.SHA256Hex(l.Memory))
	}
	for _, id := range []string{grand.Record.ID, child.Record.ID} {
		if err := r.Delete(bg(), id); err != nil {
			t.Fatal(err)
		}
	}
	st, err := r.CollectGarbage(bg())
	if err != nil {
		t.Fatal(err)
	}
	if st.Removed == 0 || st.Tombstones != 2 {
		t.Fatalf("after deleting both children: %+v, want their layers' chunks and 2 tombstones gone", st)
	}
	readsBack(t, r.keys.prefix, base.Record.ID, repotest.SHA256Hex(base.Memory))
}
