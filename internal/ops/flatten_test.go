package ops

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"warmstart/internal/layers"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/snapcheck"
)

func bg() context.Context { return context.Background() }

// chainOf publishes a base and depth children over it.
func chainOf(t *testing.T, repo repository.Repository, depth int) []repotest.Lineage {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	lin := []repotest.Lineage{repotest.PublishBase(t, repo, repotest.SmallMemoryBytes, "")}
	pages := int64(repotest.SmallMemoryBytes / layers.PageBytes)
	for range depth {
		lin = append(lin, repotest.PublishChild(t, repo, lin[len(lin)-1], repotest.RandomChange(rng, pages, 4), ""))
	}
	return lin
}

func openPOSIX(t *testing.T) *posixfs.Repo {
	t.Helper()
	repo, err := posixfs.Open(filepath.Join(t.TempDir(), "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

func verifies(t *testing.T, repo repository.Repository, id string) {
	t.Helper()
	rep, err := snapcheck.Verify(bg(), repo, id, snapcheck.Options{})
	if err != nil || !rep.OK {
		t.Fatalf("verify %s after flatten: %+v, %v", id, rep, err)
	}
}

func TestFlattenMergesTheDiffLayers(t *testing.T) {
	repo := openPOSIX(t)
	lin := chainOf(t, repo, 4)
	leaf := lin[4]
	res, err := Flatten(bg(), repo, leaf.Record.ID, FlattenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Flattened || res.DepthBefore != 4 || res.DepthAfter != 1 || res.After.ID != leaf.Record.ID ||
		res.After.MemoryLayers[0].Snapshot != lin[0].Record.ID || res.After.Parent != lin[3].Record.ID {
		t.Fatalf("flatten: %+v", res)
	}
	repotest.CheckLineage(t, repo, repotest.Lineage{Record: res.After, Memory: leaf.Memory})
	verifies(t, repo, leaf.Record.ID)
	// The middle snapshots are no longer needed by the leaf.
	for _, l := range []repotest.Lineage{lin[3], lin[2], lin[1]} {
		if err := repo.Delete(bg(), l.Record.ID); err != nil {
			t.Fatalf("delete %s under a flattened leaf: %v", l.Record.ID, err)
		}
	}
	repotest.CheckLineage(t, repo, repotest.Lineage{Record: res.After, Memory: leaf.Memory})
	if err := repo.Delete(bg(), lin[0].Record.ID); !errors.Is(err, repository.ErrHasDependents) {
		t.Fatalf("delete of the base under a depth-1 leaf = %v, want ErrHasDependents", err)
	}
	again, err := Flatten(bg(), repo, leaf.Record.ID, FlattenOptions{})
	if err != nil || again.Flattened {
		t.Fatalf("flatten of a depth-1 snapshot: %+v, %v; want nothing done", again, err)
	}
}

func TestFlattenFullFreesEveryAncestor(t *testing.T) {
	repo := openPOSIX(t)
	lin := chainOf(t, repo, 2)
	leaf := lin[2]
	res, err := Flatten(bg(), repo, leaf.Record.ID, FlattenOptions{Full: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.After.Layered() || res.After.Parent != lin[1].Record.ID || res.After.MemorySHA256 != repotest.SHA256Hex(leaf.Memory) {
		t.Fatalf("full flatten: %+v", res.After)
	}
	verifies(t, repo, leaf.Record.ID)
	for _, l := range []repotest.Lineage{lin[1], lin[0]} {
		if err := repo.Delete(bg(), l.Record.ID); err != nil {
			t.Fatalf("delete ancestor %s after a full flatten: %v", l.Record.ID, err)
		}
	}
	repotest.CheckLineage(t, repo, repotest.Lineage{Record: res.After, Memory: leaf.Memory})
}

func TestFlattenRefusesASnapshotOthersDependOn(t *testing.T) {
	repo := openPOSIX(t)
	lin := chainOf(t, repo, 3)
	_, err := Flatten(bg(), repo, lin[2].Record.ID, FlattenOptions{Full: true})
	var de *repository.DependentsError
	if !errors.As(err, &de) || len(de.Dependents) != 1 || de.Dependents[0] != lin[3].Record.ID {
		t.Fatalf("flatten of a middle snapshot = %v, want a DependentsError naming the leaf", err)
	}
	repotest.CheckLineage(t, repo, lin[2])
	repotest.CheckLineage(t, repo, lin[3])
}
