package s3

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// A read-only open (list, show, restore, verify) writes nothing to the
// bucket and creates nothing at open; every change is refused; resolving a
// snapshot then opens the node cache it reads memory through.
func TestReadOnlyOpenWritesNothing(t *testing.T) {
	needServer(t)
	t.Parallel()
	o := testOptions(t, server.Endpoint)
	w := openWith(t, o)
	rec, lease := repotest.Publish(t, w, "web")
	lease.End()
	before := keysUnder(t, w)

	ro := o
	ro.ReadOnly = true
	ro.CacheDir = filepath.Join(t.TempDir(), "cache")
	r := openWith(t, ro)
	if _, err := os.Lstat(ro.CacheDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read-only open created %s: %v", ro.CacheDir, err)
	}
	if recs, err := r.List(bg(), repository.Filter{}); err != nil || len(recs) != 1 || recs[0].ID != rec.ID {
		t.Fatalf("List = %v, %v", recs, err)
	}
	if got, err := r.Lookup(bg(), "web"); err != nil || got.ID != rec.ID {
		t.Fatalf("Lookup = %v, %v", got.ID, err)
	}
	if _, err := r.Damaged(bg()); err != nil {
		t.Fatal(err)
	}
	_, err := r.BeginCapture(bg())
	wantInvalid(t, "BeginCapture", err)
	_, err = r.LeaseExisting(bg(), rec.ID)
	wantInvalid(t, "LeaseExisting", err)
	wantInvalid(t, "Delete", r.Delete(bg(), rec.ID))
	wantInvalid(t, "Sweep", r.Sweep(bg()))
	if _, err := os.Lstat(ro.CacheDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("reading the catalog created %s: %v", ro.CacheDir, err)
	}

	res, err := r.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := repotest.ResolvedMemorySHA256(t, res); got != rec.MemorySHA256 {
		t.Fatalf("memory read read-only: %s, want %s", got, rec.MemorySHA256)
	}
	if after := keysUnder(t, w); !slices.Equal(before, after) {
		t.Fatalf("the bucket changed under a read-only repository:\nbefore %v\nafter  %v", before, after)
	}
}

func wantInvalid(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, repository.ErrInvalidRequest) {
		t.Fatalf("%s on a read-only repository: %v, want ErrInvalidRequest", what, err)
	}
}
