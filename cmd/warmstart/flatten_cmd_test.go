package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/repotest"
)

// snapshot flatten merges a depth-2 child's layers, then --full frees it
// from its ancestors; a snapshot others depend on is refused (exit 1).
func TestSnapshotFlattenVerb(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	repo, err := posixfs.Open(store, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	base := repotest.PublishBase(t, repo, repotest.SmallMemoryBytes, "")
	child := repotest.PublishChild(t, repo, base, repotest.Change{Pages: []int64{1, 4}}, "")
	leaf := repotest.PublishChild(t, repo, child, repotest.Change{Pages: []int64{4, 6}}, "leaf")

	if r := runCLI(t, "snapshot", "flatten", "--store", store, "--full", child.Record.ID); r.code != 1 || !strings.Contains(r.stderr, "live descendants "+leaf.Record.ID) {
		t.Fatalf("flatten of a parent: exit %d\n%s", r.code, r.stderr)
	}
	r := runCLI(t, "snapshot", "flatten", "--store", store, "leaf")
	if r.code != 0 || !strings.Contains(r.stdout, "depth 2 -> 1") {
		t.Fatalf("flatten leaf: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, "snapshot", "flatten", "--store", store, "--full", "--json", "leaf")
	var res struct {
		Flattened  bool `json:"flattened"`
		DepthAfter int  `json:"depth_after"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || !res.Flattened || res.DepthAfter != 0 {
		t.Fatalf("flatten --full: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for _, id := range []string{child.Record.ID, base.Record.ID} {
		if r := runCLI(t, "snapshot", "delete", "--store", store, id); r.code != 0 {
			t.Fatalf("delete ancestor %s: exit %d\n%s", id, r.code, r.stderr)
		}
	}
	res2, err := repo.Resolve(context.Background(), leaf.Record.ID)
	if err != nil || repotest.ResolvedMemorySHA256(t, res2) != repotest.SHA256Hex(leaf.Memory) {
		t.Fatalf("the leaf after its ancestors went: %v", err)
	}
	if r := runCLI(t, "snapshot", "flatten", "--help"); r.code != 0 || !strings.Contains(r.stdout, "--full") {
		t.Fatalf("flatten --help: exit %d", r.code)
	}
}
