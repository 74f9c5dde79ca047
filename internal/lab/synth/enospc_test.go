package synth

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A synth that runs out of space part-way leaves the directory as it
// was: it never pairs a new memory file with the older trace, even where
// replacing the memory file frees nothing (the old one is also linked
// elsewhere, as snapshot import --link leaves it). Here the space runs out
// while a small file is written, after the new memory file.
func TestGenerateOutOfSpaceKeepsTheOldSet(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	out := filepath.Join(dir, "ref")
	const memoryBytes = MinMemoryBytes
	old, err := Generate(context.Background(), Options{MemoryBytes: memoryBytes, Seed: 1, Dir: out})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Link(old.Memory, filepath.Join(dir, "linked-memory")); err != nil {
		t.Fatal(err)
	}
	before := hashFiles(t, old)
	trace, err := os.Stat(old.Trace)
	if err != nil {
		t.Fatal(err)
	}
	// Room for a second memory file and half a trace more.
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	used := int64(st.Blocks-st.Bfree) * st.Bsize
	size := (used + memoryBytes + trace.Size()/2) &^ 4095
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_REMOUNT, fmt.Sprintf("size=%d", size)); err != nil {
		t.Fatal(err)
	}
	_, err = Generate(context.Background(), Options{MemoryBytes: memoryBytes, Seed: 2, Dir: out})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Generate with too little space = %v, want ENOSPC", err)
	}
	after := hashFiles(t, old)
	for name := range before {
		if after[name] != before[name] {
			t.Errorf("a failed synth replaced %s", name)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(out, ".*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
