package pause

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"warmstart/internal/layers"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/repotest"
)

// TestBoundDepth: a child within the bound keeps its own layer; one past
// it gets one layer that, over the base, serves the parent's memory with
// the changed pages, also when nothing changed (a bound lowered under a
// deep chain), and the published merged child depends on the base alone.
func TestBoundDepth(t *testing.T) {
	ctx := context.Background()
	repo, err := posixfs.Open(filepath.Join(t.TempDir(), "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	pages := int64(repotest.SmallMemoryBytes / layers.PageBytes)
	lin := []repotest.Lineage{repotest.PublishBase(t, repo, repotest.SmallMemoryBytes, "")}
	for range 3 {
		lin = append(lin, repotest.PublishChild(t, repo, lin[len(lin)-1], repotest.RandomChange(rng, pages, 6), ""))
	}
	parent := lin[3]
	res, err := repo.Resolve(ctx, parent.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	own, mem := repotest.BuildLayer(t, parent.Memory, repotest.RandomChange(rng, pages, 6))

	if l, merged, err := boundDepth(t.TempDir(), parent.Record, res, own, 4); err != nil || merged || l != own {
		t.Fatalf("within the bound: %v, merged %t, %v; want the own layer", l, merged, err)
	}
	for _, tc := range []struct {
		name string
		own  *layers.Built
		mem  []byte
		max  int
	}{
		{"changed pages past the bound", own, mem, 3},
		{"nothing changed, the chain past the bound", nil, parent.Memory, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, merged, err := boundDepth(t.TempDir(), parent.Record, res, tc.own, tc.max)
			if err != nil || !merged || l == nil {
				t.Fatalf("boundDepth = %v, merged %t, %v; want a merged layer", l, merged, err)
			}
			req := repotest.LayerRequest(t, parent.Record, l, "")
			req.Merged = true
			rec := repotest.PublishLayer(t, repo, req)
			if rec.Depth() != 1 || rec.MemoryLayers[0].Snapshot != lin[0].Record.ID || rec.Parent != parent.Record.ID {
				t.Fatalf("merged child: %+v", rec)
			}
			repotest.CheckLineage(t, repo, repotest.Lineage{Record: rec, Memory: tc.mem})
		})
	}
	repotest.CheckLineage(t, repo, parent) // the old chain is untouched
}
