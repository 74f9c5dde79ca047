package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/repotest"
)

// "snapshot show" of a layered snapshot in a POSIX store names the data
// file of every layer of its chain, base first, in text and in JSON
// (files.memory_layers); it has no memory file of its own.
func TestShowNamesEveryLayerFile(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	repo, err := posixfs.Open(store, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	base := repotest.PublishBase(t, repo, repotest.SmallMemoryBytes, "")
	child := repotest.PublishChild(t, repo, base, repotest.Change{Pages: []int64{1, 4}}, "")
	leaf := repotest.PublishChild(t, repo, child, repotest.Change{Pages: []int64{4, 6}}, "leaf")
	var want []string
	for _, l := range leaf.Record.MemoryLayers {
		p := filepath.Join(store, "snapshots", l.Snapshot, repository.LayerDataFile(l.Name))
		if st, err := os.Stat(p); err != nil || st.Size() != l.Size {
			t.Fatalf("layer file %s: %v; the test's idea of the store's layout is wrong", p, err)
		}
		want = append(want, p)
	}
	if len(want) != 3 {
		t.Fatalf("the leaf has %d layers, want 3", len(want))
	}

	r := runCLI(t, "snapshot", "show", "--store", store, "leaf")
	if r.code != 0 || strings.Contains(r.stdout, "object store") || !strings.Contains(r.stdout, "3 layers, base first") {
		t.Fatalf("show: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for i, p := range want {
		if !strings.Contains(r.stdout, p) {
			t.Errorf("show does not name layer %d's file %s:\n%s", i, p, r.stdout)
		}
	}
	r = runCLI(t, "snapshot", "show", "--json", "--store", store, "leaf")
	var info api.SnapshotInfo
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &info) != nil || info.Files == nil {
		t.Fatalf("show --json: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if !slices.Equal(info.Files.MemoryLayers, want) || info.Files.Memory != "" {
		t.Fatalf("show --json files: %+v; want memory_layers %v and no memory file", info.Files, want)
	}
}
