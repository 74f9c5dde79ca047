package posixfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

func TestReadOnlyOpenOfAMissingStoreCreatesNothing(t *testing.T) {
	root := filepath.Join(t.TempDir(), "typo")
	if _, err := Open(root, Options{ReadOnly: true}); err == nil || !strings.Contains(err.Error(), root) {
		t.Fatalf("read-only open of a missing store = %v, want an error naming %s", err, root)
	}
	if _, err := os.Lstat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read-only open created %s: %v", root, err)
	}
}

// Reading a store opened read-only changes nothing in it: no lock file, no
// sweep (a damaged alias file stays for a writer to deal with), and every
// change is refused.
func TestReadOnlyStoreIsReadWithoutATrace(t *testing.T) {
	w := openTemp(t, Options{})
	rec, lease := repotest.Publish(t, w, "web")
	lease.End()
	damaged := filepath.Join(w.Root(), "catalog/aliases/broken")
	if err := os.WriteFile(damaged, []byte("not an id\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := storeFiles(t, w.Root())

	r, err := Open(w.Root(), Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if recs, err := r.List(bg(), repository.Filter{}); err != nil || len(recs) != 1 {
		t.Fatalf("List = %v, %v", recs, err)
	}
	if got, err := r.Lookup(bg(), "web"); err != nil || got.ID != rec.ID {
		t.Fatalf("Lookup(web) = %v, %v", got.ID, err)
	}
	if _, err := r.Resolve(bg(), rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.BeginCapture(bg()); !errors.Is(err, repository.ErrInvalidRequest) {
		t.Errorf("BeginCapture on a read-only store = %v", err)
	}
	if _, err := r.LeaseExisting(bg(), rec.ID); !errors.Is(err, repository.ErrInvalidRequest) {
		t.Errorf("LeaseExisting on a read-only store = %v", err)
	}
	if err := r.Delete(bg(), rec.ID); !errors.Is(err, repository.ErrInvalidRequest) {
		t.Errorf("Delete on a read-only store = %v", err)
	}
	if after := storeFiles(t, w.Root()); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("reading a read-only store changed it:\nbefore\n%s\nafter\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
}
