// Package pagecache controls and observes the host page cache of one file,
// and nothing else: the benchmark protocol of the seed prepares a private
// copy of a snapshot's memory lower file, leaves it fully resident
// ("file-warm") or drops it with one POSIX_FADV_DONTNEED ("file-cold"), and
// checks residency with mincore immediately before timing. Global cache
// controls (drop_caches) are deliberately absent: they would disturb every
// other file and user on the host.
package pagecache

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Residency is how much of a file the page cache holds.
type Residency struct {
	Resident int64 `json:"resident_pages"` // pages in the page cache
	Total    int64 `json:"total_pages"`    // pages in the file
}

// Full reports whether every page is resident.
func (r Residency) Full() bool { return r.Resident == r.Total }

// None reports whether no page is resident.
func (r Residency) None() bool { return r.Resident == 0 }

func (r Residency) String() string { return fmt.Sprintf("%d/%d pages resident", r.Resident, r.Total) }

// pageBytes is the host page size mincore reports in.
var pageBytes = int64(os.Getpagesize())

// Probe maps the file without touching it and asks mincore which pages are
// resident. Mapping PROT_NONE|MAP_SHARED never faults a page in, so the probe
// cannot change what it measures.
func Probe(path string) (Residency, error) {
	f, err := os.Open(path)
	if err != nil {
		return Residency{}, fmt.Errorf("probe residency of %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Residency{}, fmt.Errorf("probe residency of %s: %w", path, err)
	}
	size := st.Size()
	pages := (size + pageBytes - 1) / pageBytes
	if size == 0 {
		return Residency{}, nil
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_NONE, unix.MAP_SHARED)
	if err != nil {
		return Residency{}, fmt.Errorf("probe residency of %s: mmap: %w", path, err)
	}
	defer unix.Munmap(mem)
	vec := make([]byte, pages)
	if err := mincore(mem, vec); err != nil {
		return Residency{}, fmt.Errorf("probe residency of %s: mincore: %w", path, err)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return Residency{Resident: n, Total: pages}, nil
}

// mincore is not wrapped by golang.org/x/sys/unix on Linux.
func mincore(mem, vec []byte) error {
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0])))
	if errno != 0 {
		return errno
	}
	return nil
}

// Evict applies one POSIX_FADV_DONTNEED to the whole file. Clean pages leave
// the cache; dirty ones stay until written back, so callers fsync first.
func Evict(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("evict %s from page cache: %w", path, err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("evict %s from page cache: fadvise: %w", path, err)
	}
	return nil
}

// CopyVerified makes dst an independent copy of src (never a link: the copy
// must own its page cache), fsyncs it, then reads it back in full and checks
// its SHA-256 against src's. The read-back leaves dst fully resident. It
// returns the hex digest.
func CopyVerified(src, dst string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".copy-*")
	if err != nil {
		return "", fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), in); err != nil {
		tmp.Close()
		return "", fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	want := hex.EncodeToString(h.Sum(nil))
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", fmt.Errorf("copy %s to %s: fsync: %w", src, dst, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	got, err := HashFile(dst)
	if err != nil {
		return "", err
	}
	if got != want {
		return "", fmt.Errorf("copy %s to %s: sha256 %s after fsync, %s while copying", src, dst, got, want)
	}
	return got, nil
}

// HashFile reads the whole file and returns its hex SHA-256.
func HashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
