package fusedev

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// cachedPages counts the pages of [0, n) of path in the page cache,
// those still being read in included (cachestat(2); mincore would count
// only those read).
func cachedPages(t *testing.T, path string, n int) uint64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{Off: 0, Len: uint64(n)}, &st, 0); err != nil {
		t.Fatalf("cachestat %s: %v", path, err)
	}
	return st.Cache
}

// evict drops path's clean pages from the page cache.
func evict(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}

// TestPassthroughFillIsHeardOfBeforeTheGuestCanFindIt: a passthrough fill
// is readahead of the lower file, whose page cache the guest's mapping
// reads without a request; as the page cache fill's, its prefetch event
// must be recorded before any of its pages is there to find (see
// TestFillIsHeardOfBeforeTheGuestCanFindIt), so none of them may be in the
// lower's page cache while an observer is still hearing of it.
func TestPassthroughFillIsHeardOfBeforeTheGuestCanFindIt(t *testing.T) {
	const fileBytes, fillBytes = 1 << 20, 256 << 10
	lower := writeLower(t, fileBytes, 43)
	d, obs := attachHeld(t, newServer(t, Options{Passthrough: true}), "pt-heard", lower)
	f, err := os.Open(d.Path()) // a passthrough open, as a restore's
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evict(t, lower)
	if n := cachedPages(t, lower, fillBytes); n != 0 {
		t.Fatalf("%d pages of the lower still cached after eviction", n)
	}
	fill := startHeldFill(t, d, obs, 0, fillBytes)
	if n := cachedPages(t, lower, fillBytes); n != 0 {
		t.Errorf("%d pages of the fill were in the lower's page cache before the fill was heard of", n)
	}
	fill.proceed()
	if err := <-fill.filled; err != nil {
		t.Fatalf("fill: %v", err)
	}
	if n := cachedPages(t, lower, fillBytes); n == 0 {
		t.Error("the fill brought no page of the lower into its page cache")
	}
}
