package fusedev

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev"
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
	srv := newServer(t, Options{Passthrough: true})
	obs := &heldObserver{heard: make(chan struct{}), proceed: make(chan struct{})}
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Observer = obs
	d, err := srv.Attach("pt-heard", req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, d.release()) }()
	f, err := os.Open(d.Path()) // a passthrough open, as a restore's
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evict(t, lower)
	if n := cachedPages(t, lower, fillBytes); n != 0 {
		t.Fatalf("%d pages of the lower still cached after eviction", n)
	}
	filled := make(chan error, 1)
	go func() { filled <- d.Fill(0, make([]byte, fillBytes)) }()
	released := false
	proceed := func() {
		if !released {
			released = true
			close(obs.proceed)
		}
	}
	defer proceed()
	<-obs.heard
	if n := cachedPages(t, lower, fillBytes); n != 0 {
		t.Errorf("%d pages of the fill were in the lower's page cache before the fill was heard of", n)
	}
	proceed()
	if err := <-filled; err != nil {
		t.Fatalf("fill: %v", err)
	}
	if n := cachedPages(t, lower, fillBytes); n == 0 {
		t.Error("the fill brought no page of the lower into its page cache")
	}
}
