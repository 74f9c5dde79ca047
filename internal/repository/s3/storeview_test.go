package s3

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestStoreViewLivesInTheNodeCacheDir: a store view shares the node's
// client (no connections of its own left open after it), keeps its files
// in a directory of the node's cache dir that closing it removes, and the
// directory a killed verify left behind is removed once a day old, while
// a younger one (another verify running) is kept.
func TestStoreViewLivesInTheNodeCacheDir(t *testing.T) {
	node := chunkyRepo(t, "")
	cacheDir := node.opts.CacheDir
	stale := filepath.Join(cacheDir, storeViewPrefix+"killed")
	running := filepath.Join(cacheDir, storeViewPrefix+"running")
	for _, dir := range []string{stale, running} {
		if err := os.MkdirAll(filepath.Join(dir, "files"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * staleStoreViewAge)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	view, closeView, err := node.StoreView(bg())
	if err != nil {
		t.Fatal(err)
	}
	v := view.(*Repo)
	if v.core != node.core || v.counter != node.counter {
		t.Error("the view has a client of its own")
	}
	dir := v.opts.CacheDir
	if filepath.Dir(dir) != cacheDir {
		t.Errorf("the view's directory %s is not in the node's cache dir %s", dir, cacheDir)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a view directory two days old is still there: %v", err)
	}
	if _, err := os.Stat(running); err != nil {
		t.Errorf("a young view directory (another verify's) was removed: %v", err)
	}
	if err := closeView(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the view's directory is still there after close: %v", err)
	}
}
