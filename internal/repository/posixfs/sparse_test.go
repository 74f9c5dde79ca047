package posixfs

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"syscall"
	"testing"

	"warmstart/internal/layout"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestImportKeepsAMostlyHoleMemoryFileSparse publishes a 256 MiB memory file
// that is one page of data and holes elsewhere, as a large guest's snapshot
// that touched little of its memory is. The stored copy must take about the
// disk the source takes, not its whole size: a 64 GiB guest's snapshot
// otherwise fills the store's disk with zeros.
func TestImportKeepsAMostlyHoleMemoryFileSparse(t *testing.T) {
	t.Parallel()
	const size = 256 << 20
	in := repotest.NewInputs(t, 4096)
	f, err := os.OpenFile(in.MemoryPath, os.O_RDWR|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	page := make([]byte, 4096)
	if _, err := rand.Read(page); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(page, size/2); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if allocated(t, in.MemoryPath) > 1<<20 {
		t.Skipf("%s: the temporary directory's file system keeps no holes", in.MemoryPath)
	}
	in.MemorySize, in.Layout, in.MemorySHA256 = size, layout.Single(size), fileSHA256(t, in.MemoryPath)

	r := openTemp(t, Options{})
	rec, _ := repotest.PublishInputs(t, r, in, "sparse")
	if rec.MemorySHA256 != in.MemorySHA256 {
		t.Fatalf("published memory SHA-256 %s, source %s", rec.MemorySHA256, in.MemorySHA256)
	}
	stored := r.paths.artifactPath(rec.ID, repository.MemoryFileName)
	if got := fileSHA256(t, stored); got != in.MemorySHA256 {
		t.Fatalf("stored memory reads back as %s, source %s", got, in.MemorySHA256)
	}
	if fi, err := os.Stat(stored); err != nil || fi.Size() != size {
		t.Fatalf("stored memory: %v, size %d, want %d", err, fi.Size(), size)
	}
	if got := allocated(t, stored); got > 1<<20 {
		t.Fatalf("stored copy of a file with %d bytes of data allocates %d bytes", len(page), got)
	}
}

// allocated is the disk space path's blocks take.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
