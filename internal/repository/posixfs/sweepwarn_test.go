package posixfs

import (
	"errors"
	"os"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// An alias entry that is a directory where the file belongs does not stop
// the writable open: it is damage, quarantined by the sweep, and imports
// and deletes of other snapshots work. Before, every writer and the
// daemon's start failed with "sweep: read alias …: is a directory".
func TestUnsweepableEntryDoesNotCloseTheStore(t *testing.T) {
	r := openTemp(t, Options{})
	keep, lease := repotest.Publish(t, r, "keep")
	lease.End()
	bad := r.paths.aliasPath("ref")
	if err := os.Mkdir(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	var warned []error
	again, err := Open(r.Root(), Options{Warn: func(err error) { warned = append(warned, err) }})
	if err != nil {
		t.Fatalf("open with an alias that is a directory: %v", err)
	}
	if len(warned) != 0 {
		t.Errorf("warnings %v; want none: a damaged alias is quarantined", warned)
	}
	if _, err := os.Lstat(bad); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the directory alias is still in place: %v", err)
	}
	other, lease := repotest.Publish(t, again, "other")
	lease.End()
	if _, err := repository.DeleteRef(bg(), again, keep.ID); err != nil {
		t.Fatalf("delete of another snapshot: %v", err)
	}
	if _, err := again.Get(bg(), keep.ID); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("deleted snapshot still there: %v", err)
	}
	if _, err := again.Get(bg(), other.ID); err != nil {
		t.Fatalf("imported snapshot: %v", err)
	}
}
