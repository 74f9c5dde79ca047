package durable

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteBytesReplacesTheFileWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("old contents"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteBytes(path, 0o444, []byte("new")); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "new" {
		t.Fatalf("read back %q, %v", got, err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o444 {
		t.Fatalf("mode %v, %v; want 0444", st.Mode(), err)
	}
	onlyFile(t, path)
}

// A fill that fails leaves the old file and no temporary file.
func TestFailedFillLeavesTheOldFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := WriteFile(path, 0o644, func(w io.Writer) error {
		if _, err := w.Write([]byte("half")); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the fill's", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Fatalf("path holds %q after a failed write", got)
	}
	onlyFile(t, path)
}

func TestMissingDirectoryIsAnError(t *testing.T) {
	if err := WriteBytes(filepath.Join(t.TempDir(), "no", "f"), 0o644, nil); err == nil {
		t.Fatal("a write into a missing directory succeeded")
	}
}

// onlyFile fails unless path is the only entry of its directory.
func onlyFile(t *testing.T, path string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil || len(entries) != 1 || entries[0].Name() != filepath.Base(path) {
		t.Fatalf("directory holds %v, %v; want only %s", entries, err, filepath.Base(path))
	}
}
