package posixfs

import (
	"errors"
	"os"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// An alias entry the sweep cannot read (a directory where the file
// belongs) does not stop the writable open: the store opens, the problem
// goes to Warn naming the entry, and imports and deletes of other
// snapshots work. Before, every writer and the daemon's start failed with
// "sweep: read alias …: is a directory".
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
	if len(warned) != 1 || !strings.Contains(warned[0].Error(), bad) {
		t.Fatalf("warnings %v; want one naming %s", warned, bad)
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
