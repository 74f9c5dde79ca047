package s3

import (
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/repository/repotest"
)

// TestResolveAfterTheNodeCacheFilesWereRemoved removes the node cache's
// directory of VM states, manifests and chunk maps (an operator clearing
// the cache, a temporary-file reaper) under a running repository. The next
// resolve fetches them again from the store: before, writing the fetched
// chunk map into the missing directory failed with "no such file", which
// the resolve took for the object missing from the store, so every restore
// of every snapshot failed with an integrity error until a restart.
func TestResolveAfterTheNodeCacheFilesWereRemoved(t *testing.T) {
	t.Parallel()
	needServer(t)
	o := testOptions(t, server.Endpoint)
	repo := openWith(t, o)
	rec, lease := repotest.Publish(t, repo, "")
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Resolve(bg(), rec.ID); err != nil {
		t.Fatalf("resolve: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(o.CacheDir, "files")); err != nil {
		t.Fatal(err)
	}
	res, err := repo.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatalf("resolve once the node cache's files were removed: %v", err)
	}
	if _, err := os.Stat(res.VMStatePath); err != nil {
		t.Errorf("resolved VM state: %v", err)
	}
}
