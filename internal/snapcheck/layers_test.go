package snapcheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/layers"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// chain publishes a base and two children over it (posixfs).
func chain(t *testing.T) (*fixture, []repotest.Lineage) {
	t.Helper()
	f := newFixture(t)
	mem, err := os.ReadFile(f.in.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	lin := []repotest.Lineage{{Record: f.rec, Memory: mem}}
	for _, ch := range []repotest.Change{{Pages: []int64{1, 2, 9}, Zero: []int64{3}}, {Pages: []int64{2, 40}}} {
		built, mem := repotest.BuildLayer(t, lin[len(lin)-1].Memory, ch)
		req := repotest.LayerRequest(t, lin[len(lin)-1].Record, built, "")
		req.Manifest, req.Recording = nil, nil
		lin = append(lin, repotest.Lineage{Record: repotest.PublishLayer(t, f.repo, req), Memory: mem})
	}
	return f, lin
}

func TestVerifyWalksTheChain(t *testing.T) {
	f, lin := chain(t)
	grand := lin[2].Record
	rep, err := Verify(bg(), f.repo, grand.ID, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		t.Fatalf("a sound chain: %+v", rep)
	}
	var layersRead int
	for _, a := range rep.Artifacts {
		if a.Layer != nil && strings.HasSuffix(a.Name, ".bin") {
			layersRead++
			if a.Status != StatusOK || a.ReadBytes != a.Size {
				t.Errorf("layer data %s: %+v", a.Name, a)
			}
		}
	}
	if layersRead != 3 {
		t.Fatalf("verify read %d layers' data, want the base's and both children's", layersRead)
	}
}

// A flipped byte in the middle layer (the child's) shows in the
// grandchild's report, naming the layer's owner and the page it serves.
func TestVerifyNamesTheDamagedAncestorLayer(t *testing.T) {
	f, lin := chain(t)
	child, grand := lin[1].Record, lin[2].Record
	own := child.MemoryLayers[1]
	path := filepath.Join(f.repo.Root(), "snapshots", child.ID, repository.LayerDataFile(own.Name))
	writable(t, path, func() { repotest.FlipBytes(t, path, layers.PageBytes+10) }) // slot 1: page 2
	rep, err := Verify(bg(), f.repo, grand.ID, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK {
		t.Fatal("verify says a chain with a damaged ancestor layer is OK")
	}
	for _, a := range rep.Artifacts {
		if a.Name != child.ID+"/"+repository.LayerDataFile(own.Name) {
			continue
		}
		if a.Blocks == nil || a.Blocks.Bad != 1 || a.Blocks.BadRanges[0].Offset != layers.PageBytes ||
			!strings.Contains(a.Note, "owned by "+child.ID) || !strings.Contains(a.Note, "pages 2") {
			t.Fatalf("damaged layer reported as %+v", a)
		}
		return
	}
	t.Fatal("the report has no entry for the child's layer")
}

// An owner whose record no longer decodes is a chain problem of its
// descendants.
func TestVerifyReportsALostOwner(t *testing.T) {
	f, lin := chain(t)
	child, grand := lin[1].Record, lin[2].Record
	rec := filepath.Join(f.repo.Root(), "catalog", "records", child.ID+".json")
	writable(t, rec, func() {
		if err := os.WriteFile(rec, []byte("{"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	rep, err := Verify(bg(), f.repo, grand.ID, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Problems {
		if p.Kind == KindChain && strings.Contains(p.Message, child.ID) {
			return
		}
	}
	t.Fatalf("no chain problem naming %s: %+v", child.ID, rep.Problems)
}
