package chunkcache

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// blockFiles counts the block files of object under the cache directory.
func blockFiles(t *testing.T, c *Cache, object string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(c.objectDir(object), "*"+chunkSuffix))
	if err != nil {
		t.Fatal(err)
	}
	return len(files)
}

// warmAll warms the whole of obj with opts and waits for it to end, or
// fails the test: a warming must never wait for the writers it holds.
func warmAll(t *testing.T, c *Cache, obj Object, o WarmOptions) *Warming {
	t.Helper()
	w, err := c.Warm(obj, []Range{{0, obj.Size}}, o)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the warming did not end")
	}
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestWarmHoldsWrites: the blocks a warming that holds the writes fetched
// are served from memory, with the right bytes, and reach the disk once
// it releases them, not before.
func TestWarmHoldsWrites(t *testing.T) {
	c := openCache(t, t.TempDir(), 64<<20)
	// The writers run: a demand read's block reaches the disk.
	before := newOrigin(t, testBlock)
	readCheck(t, openReader(t, c, before.object("before")), before, 0, testBlock)
	waitFor(t, "the demand read's block on disk", func() bool { return blockFiles(t, c, "before") == 1 })

	o := newOrigin(t, 4*testBlock)
	w := warmAll(t, c, o.object("obj"), WarmOptions{HoldWrites: true})
	readCheck(t, openReader(t, c, o.object("obj")), o, 0, int64(len(o.data)))
	if n := blockFiles(t, c, "obj"); n != 0 {
		t.Fatalf("%d blocks written while the warming holds the writes", n)
	}
	if fetches := o.fetches.Load(); fetches != 1 {
		t.Fatalf("%d fetches, want the warming's one", fetches)
	}
	w.ReleaseWrites()
	waitFor(t, "the warmed blocks on disk", func() bool { return blockFiles(t, c, "obj") == 4 })
	readCheck(t, openReader(t, c, o.object("obj")), o, 0, int64(len(o.data)))
}

// TestHeldWritesAreBounded: a warming that holds the writes and fetches
// more blocks than the persist queue keeps in memory still ends (the
// writers write once the queue is half full), and Close writes every
// block whatever the holds.
func TestHeldWritesAreBounded(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(Options{Dir: dir, MaxBytes: 64 << 20, BlockBytes: testBlock})
	if err != nil {
		t.Fatal(err)
	}
	blocks := persistQueueBlocks + 8
	o := newOrigin(t, blocks*testBlock)
	warmAll(t, c, o.object("obj"), WarmOptions{HoldWrites: true}) // never released
	if n := blockFiles(t, c, "obj"); n == 0 {
		t.Fatalf("no block written with %d of them held", blocks)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close waits for a hold nobody releases")
	}
	entries, err := os.ReadDir(filepath.Join(dir, chunksDirName, "obj"))
	if err != nil || len(entries) != blocks {
		t.Fatalf("%d files after Close (%v), want %d blocks", len(entries), err, blocks)
	}
}
