package chunkcache

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A second Open of a directory another cache has open (a read-only CLI
// verb beside a running daemon: flock sets each Open's descriptor apart
// as it does two processes) removes nothing: not the first cache's
// temporary block being written, not its blocks when its own bound is
// smaller. Once the first is closed, the next Open cleans up again.
func TestSecondOpenRemovesNothing(t *testing.T) {
	dir := t.TempDir()
	o := newOrigin(t, 4*testBlock)
	first := openCache(t, dir, 64<<20)
	r := openReader(t, first, o.object("obj"))
	for i := range int64(4) {
		readCheck(t, r, o, i*testBlock, testBlock)
	}
	r.Close()
	first.Close() // writes the blocks out
	owner := openCache(t, dir, 64<<20)
	blocks, err := filepath.Glob(filepath.Join(dir, chunksDirName, "obj", "*"+chunkSuffix))
	if err != nil || len(blocks) != 4 {
		t.Fatalf("block files %v (%v), want 4", blocks, err)
	}
	// The owner's write in progress, before its rename.
	tmp := filepath.Join(dir, chunksDirName, "obj", tempPrefix+"inflight")
	if err := os.WriteFile(tmp, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}

	second := openCache(t, dir, testBlock) // room for one block: it evicts the rest
	r2 := openReader(t, second, o.object("obj"))
	for i := range int64(4) {
		readCheck(t, r2, o, i*testBlock, testBlock)
	}
	r2.Close()
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatalf("the second Open removed the owner's write in progress: %v", err)
	}
	for _, b := range blocks {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("the second cache removed the owner's block: %v", err)
		}
	}
	r3 := openReader(t, owner, o.object("obj"))
	for i := range int64(4) {
		readCheck(t, r3, o, i*testBlock, testBlock)
	}
	r3.Close()

	if err := owner.Close(); err != nil {
		t.Fatal(err)
	}
	openCache(t, dir, 64<<20)
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an Open alone on the directory left the interrupted write: %v", err)
	}
}
