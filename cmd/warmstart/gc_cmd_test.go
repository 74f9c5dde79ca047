package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestSnapshotGCOnPosixStore: a POSIX store has no shared chunks, and the
// verb says so instead of failing.
func TestSnapshotGCOnPosixStore(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	out, _, err := runSnapshotVerb(t, store, "gc")
	if err != nil || !strings.Contains(out, "nothing to collect") {
		t.Fatalf("snapshot gc = %q, %v", out, err)
	}
	if _, _, err := runSnapshotVerb(t, store, "gc", "extra"); err == nil {
		t.Fatal("snapshot gc took an argument")
	}
}
