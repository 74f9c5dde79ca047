package qemu

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestCopySparse: the copy holds the same bytes, all-zero pages are holes
// (the copy of a mostly zero file takes little disk), a trailing partial
// page is kept, and an existing destination is never overwritten.
func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	const size = 64*copyPageBytes + 100
	data := make([]byte, size)
	for _, page := range []int{0, 3, 40} {
		data[page*copyPageBytes+7] = byte(page + 1)
	}
	data[size-1] = 0xff
	src, dst := filepath.Join(dir, "mem"), filepath.Join(dir, "copy")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := copySparse(src, dst); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("the copy differs from the source (%d bytes, want %d)", len(got), len(data))
	}
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	// Four non-zero pages, 4 KiB blocks: at most a few blocks more for
	// file systems that allocate around writes.
	if blocks := fi.Sys().(*syscall.Stat_t).Blocks * 512; blocks > 16*copyPageBytes {
		t.Errorf("the copy of 4 non-zero pages takes %d bytes on disk: zero pages were written", blocks)
	}
	if err := copySparse(src, dst); !errors.Is(err, os.ErrExist) {
		t.Errorf("copy onto an existing file: %v, want ErrExist", err)
	}
	if err := copySparse(filepath.Join(dir, "missing"), filepath.Join(dir, "c2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("copy of a missing file: %v, want ErrNotExist", err)
	}
}
