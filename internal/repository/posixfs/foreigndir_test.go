package posixfs_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
)

// TestOpenRefusesADirectoryThatHoldsSomethingElse: a writable open makes
// a store where there is none, so `snapshot import` or `store init` with
// snapshot_store mistyped as an existing directory (a home, /etc) filled
// it with catalog/ and snapshots/ beside its own files and said the store
// was ready. A directory that holds anything but a store is refused,
// naming an entry; an empty one, one holding only lost+found (a file
// system mounted there) and an existing store open as before.
func TestOpenRefusesADirectoryThatHoldsSomethingElse(t *testing.T) {
	home := t.TempDir()
	if err := os.WriteFile(filepath.Join(home, "notes.txt"), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := posixfs.Open(home, posixfs.Options{})
	if !errors.Is(err, repository.ErrInvalidRequest) || !strings.Contains(err.Error(), home) || !strings.Contains(err.Error(), "notes.txt") {
		t.Errorf("open of a directory holding notes.txt: %v; want a refusal naming it and notes.txt", err)
	}
	if left, _ := os.ReadDir(home); len(left) != 1 {
		t.Errorf("the refused directory holds %d entries, want its one file only", len(left))
	}

	mounted := t.TempDir()
	if err := os.Mkdir(filepath.Join(mounted, "lost+found"), 0o700); err != nil {
		t.Fatal(err)
	}
	existing := filepath.Join(t.TempDir(), "store")
	for _, dir := range []string{t.TempDir(), mounted, existing, filepath.Join(t.TempDir(), "new")} {
		if _, err := posixfs.Open(dir, posixfs.Options{}); err != nil {
			t.Errorf("open %s: %v", dir, err)
		}
	}
	if _, err := posixfs.Open(existing, posixfs.Options{}); err != nil {
		t.Errorf("second open of a store: %v", err)
	}
}
