package chunkcache

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"warmstart/internal/logtest"
)

// The cache is tested against an origin serving a byte slice through the
// same FetchFunc the S3 backend provides; the S3 package's tests run it
// against MinIO.

const testBlock = 64 << 10

// origin is an object's bytes plus controls over how fetches of it go.
type origin struct {
	data    []byte
	fetches atomic.Int64
	// gate, when set, holds every fetch until it is closed.
	gate chan struct{}
	// started receives the offset of each fetch as it begins, when set.
	started chan int64
	// fail, when set, fails every fetch with it.
	fail atomic.Pointer[error]
	// short makes responses one byte short.
	short atomic.Bool
}

func newOrigin(t *testing.T, size int) *origin {
	t.Helper()
	o := &origin{data: make([]byte, size)}
	if _, err := rand.Read(o.data); err != nil {
		t.Fatal(err)
	}
	return o
}

func (o *origin) fetch(ctx context.Context, off, length int64) (io.ReadCloser, error) {
	o.fetches.Add(1)
	if o.started != nil {
		o.started <- off
	}
	if o.gate != nil {
		select {
		case <-o.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if p := o.fail.Load(); p != nil {
		return nil, *p
	}
	if off < 0 || off+length > int64(len(o.data)) {
		return nil, fmt.Errorf("range [%d, %d) outside %d bytes", off, off+length, len(o.data))
	}
	if o.short.Load() {
		length--
	}
	return io.NopCloser(bytes.NewReader(o.data[off : off+length])), nil
}

func (o *origin) object(id string) Object {
	return Object{ID: id, Size: int64(len(o.data)), Fetch: o.fetch}
}

func openCache(t *testing.T, dir string, maxBytes int64) *Cache {
	t.Helper()
	c, err := Open(Options{Dir: dir, MaxBytes: maxBytes, BlockBytes: testBlock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// holdoffReader opens a cache whose failure holdoff is holdoff and a
// reader of a two-block object "obj" of a fresh origin.
func holdoffReader(t *testing.T, holdoff time.Duration) (*origin, *Cache, *Reader) {
	t.Helper()
	o := newOrigin(t, 2*testBlock)
	c, err := Open(Options{Dir: t.TempDir(), MaxBytes: 64 << 20, BlockBytes: testBlock, FailureHoldoff: holdoff})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return o, c, openReader(t, c, o.object("obj"))
}

func openReader(t *testing.T, c *Cache, obj Object) *Reader {
	t.Helper()
	r, err := c.Open(obj)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// readCheck reads [off, off+n) through r and compares with the origin.
func readCheck(t *testing.T, r *Reader, o *origin, off, n int64) {
	t.Helper()
	buf := make([]byte, n)
	got, err := r.ReadAt(buf, off)
	end := min(off+n, int64(len(o.data)))
	if err != nil && !(errors.Is(err, io.EOF) && off+n > int64(len(o.data))) {
		t.Fatalf("ReadAt(%d, %d): %v", off, n, err)
	}
	if int64(got) != end-off || !bytes.Equal(buf[:got], o.data[off:end]) {
		t.Fatalf("ReadAt(%d, %d) returned %d bytes that differ from the object", off, n, got)
	}
}

// waitFor polls cond until it holds; it fails the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestReadsMatchObjectAndFetchEachBlockOnce(t *testing.T) {
	o := newOrigin(t, 5*testBlock+1234) // a short last block
	c := openCache(t, t.TempDir(), 64<<20)
	r := openReader(t, c, o.object("obj"))
	rng := mrand.New(mrand.NewPCG(1, 2))
	for range 200 {
		off := rng.Int64N(int64(len(o.data)))
		n := 1 + rng.Int64N(3*testBlock)
		readCheck(t, r, o, off, n)
	}
	readCheck(t, r, o, 0, int64(len(o.data)))
	if got := o.fetches.Load(); got > 6 {
		t.Fatalf("%d fetches for 6 blocks", got)
	}
	s := c.Stats()
	if s.Blocks != 6 || s.UsedBytes != int64(len(o.data)) {
		t.Fatalf("cache holds %d blocks, %d bytes; want 6, %d", s.Blocks, s.UsedBytes, len(o.data))
	}
	if _, err := r.ReadAt(make([]byte, 1), int64(len(o.data))); !errors.Is(err, io.EOF) {
		t.Fatalf("read at the end: %v, want io.EOF", err)
	}
}

// TestReadAcrossBlocksIsOneFetch: a read spanning several missing blocks
// fetches them with one ranged GET.
func TestReadAcrossBlocksIsOneFetch(t *testing.T) {
	o := newOrigin(t, 8*testBlock)
	c := openCache(t, t.TempDir(), 64<<20)
	r := openReader(t, c, o.object("obj"))
	readCheck(t, r, o, testBlock/2, 3*testBlock)
	if got := o.fetches.Load(); got != 1 {
		t.Fatalf("%d fetches for one read over 4 blocks, want 1", got)
	}
}

func TestConcurrentMissesMakeOneFetch(t *testing.T) {
	const readers = 8
	o := newOrigin(t, 4*testBlock)
	o.gate = make(chan struct{})
	c := openCache(t, t.TempDir(), 64<<20)
	r := openReader(t, c, o.object("obj"))
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for i := range readers {
		wg.Go(func() {
			buf := make([]byte, 4096)
			off := int64(testBlock + i*4096)
			if _, err := r.ReadAt(buf, off); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(buf, o.data[off:off+4096]) {
				errs <- fmt.Errorf("reader %d got wrong bytes", i)
			}
		})
	}
	waitFor(t, "every reader to wait on the one fetch", func() bool {
		s := c.Stats()
		return s.Misses == 1 && s.Joins == readers-1
	})
	close(o.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := o.fetches.Load(); got != 1 {
		t.Fatalf("%d fetches, want 1", got)
	}
}

func TestFetchFailureIsNotCached(t *testing.T) {
	o := newOrigin(t, 2*testBlock)
	c, err := Open(Options{Dir: t.TempDir(), MaxBytes: 64 << 20, BlockBytes: testBlock, FailureHoldoff: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := openReader(t, c, o.object("obj"))
	boom := errors.New("store unreachable")
	o.fail.Store(&boom)
	if n, err := r.ReadAt(make([]byte, 100), 10); !errors.Is(err, boom) || n != 0 {
		t.Fatalf("read with a failing store: %d, %v", n, err)
	}
	o.short.Store(true)
	o.fail.Store(nil)
	if n, err := r.ReadAt(make([]byte, 100), 10); !errors.Is(err, ErrShortFetch) || n != 0 {
		t.Fatalf("read with a short answer: %d, %v", n, err)
	}
	if s := c.Stats(); s.Blocks != 0 || s.FetchErrors != 2 {
		t.Fatalf("after failures: %d blocks cached, %d fetch errors", s.Blocks, s.FetchErrors)
	}
	o.short.Store(false)
	readCheck(t, r, o, 10, 100)
}

// TestFailureHoldoff: after a failed fetch, reads of the block fail at
// once, without another GET, until the holdoff has passed; other blocks
// are fetched as usual.
func TestFailureHoldoff(t *testing.T) {
	o, c, r := holdoffReader(t, time.Hour)
	boom := errors.New("store unreachable")
	o.fail.Store(&boom)
	if _, err := r.ReadAt(make([]byte, 10), 0); !errors.Is(err, boom) {
		t.Fatalf("first read: %v", err)
	}
	o.fail.Store(nil)
	for range 3 {
		if _, err := r.ReadAt(make([]byte, 10), 100); !errors.Is(err, boom) {
			t.Fatalf("read within the holdoff: %v, want the fetch's error again", err)
		}
	}
	if got, held := o.fetches.Load(), c.Stats().HeldOff; got != 1 || held != 3 {
		t.Fatalf("%d fetches and %d held-off reads, want 1 and 3", got, held)
	}
	// Another block fetched fine: the store is back, the holdoff ends.
	readCheck(t, r, o, testBlock, 10)
	if s := c.Stats(); s.FailedBlocks != 0 {
		t.Fatalf("%d blocks still held off after a successful fetch", s.FailedBlocks)
	}
	readCheck(t, r, o, 100, 10)
}

// TestBoundWithPins fills a 4-block cache: blocks of a pinned object are
// never evicted (new ones are served without being kept), and once it is
// unpinned they give way to another object's.
func TestBoundWithPins(t *testing.T) {
	const maxBlocks = 4
	a, b := newOrigin(t, 10*testBlock), newOrigin(t, 10*testBlock)
	c := openCache(t, t.TempDir(), maxBlocks*testBlock)
	ra := openReader(t, c, a.object("a"))
	for i := range int64(10) {
		readCheck(t, ra, a, i*testBlock, testBlock)
	}
	s := c.Stats()
	if s.UsedBytes > c.MaxBytes() || s.PeakBytes > c.MaxBytes() {
		t.Fatalf("cache holds %d bytes (peak %d), bound %d", s.UsedBytes, s.PeakBytes, c.MaxBytes())
	}
	if s.Evictions != 0 || s.Uncached != 10-maxBlocks {
		t.Fatalf("pinned object: %d evictions, %d uncached; want 0 and %d", s.Evictions, s.Uncached, 10-maxBlocks)
	}
	for i := range int64(maxBlocks) {
		if !c.Cached("a", i) {
			t.Fatalf("pinned block %d was evicted", i)
		}
	}
	ra.Close()
	rb := openReader(t, c, b.object("b"))
	for i := range int64(10) {
		readCheck(t, rb, b, i*testBlock, testBlock)
	}
	s = c.Stats()
	if s.PeakBytes > c.MaxBytes() || s.Evictions < maxBlocks {
		t.Fatalf("after unpinning: peak %d bytes (bound %d), %d evictions", s.PeakBytes, c.MaxBytes(), s.Evictions)
	}
	for i := range int64(maxBlocks) {
		if c.Cached("a", i) {
			t.Fatalf("unpinned block a/%d survived while b filled the cache", i)
		}
	}
}

// TestDiskFilesSurviveReopen checks that blocks are written to disk and
// served from there after the cache is reopened, with no fetch.
func TestDiskFilesSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	o := newOrigin(t, 3*testBlock)
	c := openCache(t, dir, 64<<20)
	readCheck(t, openReader(t, c, o.object("obj")), o, 0, int64(len(o.data)))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	before := o.fetches.Load()
	c2 := openCache(t, dir, 64<<20)
	if s := c2.Stats(); s.Blocks != 3 {
		t.Fatalf("reopened cache indexed %d blocks, want 3", s.Blocks)
	}
	readCheck(t, openReader(t, c2, o.object("obj")), o, 0, int64(len(o.data)))
	if got := o.fetches.Load() - before; got != 0 {
		t.Fatalf("%d fetches after reopening a full cache", got)
	}
}

// TestCorruptBlocksDiscardedAndRefetched damages cached block files the
// ways a crash or a disk can (a flipped byte, a truncation, a leftover
// temporary file) and checks that the cache never serves them.
func TestCorruptBlocksDiscardedAndRefetched(t *testing.T) {
	dir := t.TempDir()
	o := newOrigin(t, 4*testBlock)
	c := openCache(t, dir, 64<<20)
	readCheck(t, openReader(t, c, o.object("obj")), o, 0, int64(len(o.data)))
	c.Close()
	files, err := filepath.Glob(filepath.Join(dir, chunksDirName, "obj", "*"+chunkSuffix))
	if err != nil || len(files) != 4 {
		t.Fatalf("block files %v (%v), want 4", files, err)
	}
	byIndex := map[int64]string{}
	for _, f := range files {
		_, idx, _, _, ok := parseChunkName(filepath.Base(f))
		if !ok {
			t.Fatalf("unparsable block name %s", f)
		}
		byIndex[idx] = f
	}
	// Block 1: one byte flipped, same length (only the checksum sees it).
	data, _ := os.ReadFile(byIndex[1])
	data[100] ^= 0xff
	os.Chmod(byIndex[1], 0o644)
	if err := os.WriteFile(byIndex[1], data, 0o644); err != nil {
		t.Fatal(err)
	}
	// Block 2: truncated (caught by the size check on open).
	if err := os.Truncate(byIndex[2], testBlock/2); err != nil {
		t.Fatal(err)
	}
	// A write interrupted before its rename.
	tmp := filepath.Join(dir, chunksDirName, "obj", tempPrefix+"deadbeef")
	if err := os.WriteFile(tmp, data[:10], 0o644); err != nil {
		t.Fatal(err)
	}

	before := o.fetches.Load()
	c2 := openCache(t, dir, 64<<20)
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file survived Open: %v", err)
	}
	r := openReader(t, c2, o.object("obj"))
	for i := range int64(4) {
		readCheck(t, r, o, i*testBlock, testBlock)
	}
	s := c2.Stats()
	if s.Corrupt != 2 {
		t.Fatalf("%d corrupt blocks detected, want 2", s.Corrupt)
	}
	if got := o.fetches.Load() - before; got != 2 {
		t.Fatalf("%d refetches, want 2", got)
	}
	// The refetched blocks are good on disk again.
	c2.Close()
	c3 := openCache(t, dir, 64<<20)
	r3 := openReader(t, c3, o.object("obj"))
	for i := range int64(4) {
		readCheck(t, r3, o, i*testBlock, testBlock)
	}
	if s := c3.Stats(); s.Corrupt != 0 {
		t.Fatalf("refetched blocks are corrupt on disk: %+v", s)
	}
}

// TestOtherBlockSizeDiscarded reopens a cache with another block size.
func TestOtherBlockSizeDiscarded(t *testing.T) {
	dir := t.TempDir()
	o := newOrigin(t, 2*testBlock)
	c := openCache(t, dir, 64<<20)
	readCheck(t, openReader(t, c, o.object("obj")), o, 0, int64(len(o.data)))
	c.Close()
	c2, err := Open(Options{Dir: dir, MaxBytes: 64 << 20, BlockBytes: 2 * testBlock})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if s := c2.Stats(); s.Blocks != 0 {
		t.Fatalf("blocks of another size indexed: %+v", s)
	}
	left, _ := filepath.Glob(filepath.Join(dir, chunksDirName, "obj", "*"))
	if len(left) != 0 {
		t.Fatalf("files left: %v", left)
	}
}

func TestOpenRejects(t *testing.T) {
	for name, o := range map[string]Options{
		"no dir":       {MaxBytes: 1 << 20},
		"no bound":     {Dir: t.TempDir()},
		"odd block":    {Dir: t.TempDir(), MaxBytes: 1 << 20, BlockBytes: 5000},
		"object on id": {Dir: t.TempDir(), MaxBytes: 1 << 20},
	} {
		if name == "object on id" {
			c, err := Open(o)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"", "../x", "a/b", strings.Repeat("a", 129)} {
				if _, err := c.Open(Object{ID: id, Size: 1, Fetch: newOrigin(t, 1).fetch}); !errors.Is(err, ErrInvalidObject) {
					t.Errorf("Open(object %q): %v", id, err)
				}
			}
			c.Close()
			continue
		}
		if c, err := Open(o); err == nil {
			c.Close()
			t.Errorf("%s: Open accepted %+v", name, o)
		}
	}
}

func TestClosedCacheRefuses(t *testing.T) {
	o := newOrigin(t, testBlock)
	c := openCache(t, t.TempDir(), 64<<20)
	r := openReader(t, c, o.object("obj"))
	c.Close()
	if _, err := r.ReadAt(make([]byte, 10), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("read after Close: %v", err)
	}
	if _, err := c.Open(o.object("obj")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Open after Close: %v", err)
	}
}

// TestFailureHoldoffGrowsWhileFetchesKeepFailing: each fetch of a block
// that fails again, once its holdoff is over, doubles the holdoff, up to
// 16 times the configured one: a store that stays down is asked less and
// less often while restarted page faults fail at once. A failure long
// after the last starts over; a fetch that succeeds ends it all.
func TestFailureHoldoffGrowsWhileFetchesKeepFailing(t *testing.T) {
	const holdoff = time.Hour
	o, c, r := holdoffReader(t, holdoff)
	boom := errors.New("store unreachable")
	o.fail.Store(&boom)
	key := blockKey{"obj", 0}
	for attempt, want := range []time.Duration{1, 2, 4, 8, 16, 16, 16} {
		began := time.Now()
		if _, err := r.ReadAt(make([]byte, 10), 0); !errors.Is(err, boom) {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
		c.mu.Lock()
		fail := c.failures[key]
		left := fail.until.Sub(began)
		fail.until = time.Now().Add(-time.Nanosecond) // its holdoff is over
		c.failures[key] = fail
		c.mu.Unlock()
		if left < want*holdoff || left > want*holdoff+time.Minute {
			t.Fatalf("attempt %d: held off for %v, want %v", attempt, left, want*holdoff)
		}
	}
	if got := o.fetches.Load(); got != 7 {
		t.Fatalf("%d fetches, want one per attempt", got)
	}
	// A failure whose holdoff ended long ago (longer than the longest
	// holdoff) is not a streak: the next one starts over.
	c.mu.Lock()
	fail := c.failures[key]
	fail.until = time.Now().Add(-17 * holdoff)
	c.failures[key] = fail
	c.mu.Unlock()
	began := time.Now()
	if _, err := r.ReadAt(make([]byte, 10), 0); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	c.mu.Lock()
	left := c.failures[key].until.Sub(began)
	c.mu.Unlock()
	if left < holdoff || left > holdoff+time.Minute {
		t.Fatalf("after a long pause: held off for %v, want %v", left, holdoff)
	}
	o.fail.Store(nil)
	readCheck(t, r, o, testBlock, 10) // the store is back
	c.mu.Lock()
	_, noted := c.failures[key]
	c.mu.Unlock()
	if noted {
		t.Fatal("a successful fetch left the failures of the object's blocks noted")
	}
}

// TestFullOfPinnedBlocksIsLogged: a cache so small that the objects being
// read fill it makes every later miss a fetch whose block is not kept; an
// operator is told once per such episode, with the bound to raise.
func TestFullOfPinnedBlocksIsLogged(t *testing.T) {
	const maxBlocks = 2
	var logs logtest.Buffer
	o := newOrigin(t, 6*testBlock)
	c, err := Open(Options{Dir: t.TempDir(), MaxBytes: maxBlocks * testBlock, BlockBytes: testBlock,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := openReader(t, c, o.object("obj"))
	for i := range int64(6) {
		readCheck(t, r, o, i*testBlock, 10)
	}
	lines := logs.Take()
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "not kept") ||
		!strings.Contains(lines[0], fmt.Sprint(maxBlocks*testBlock)) {
		t.Fatalf("log of a cache full of pinned blocks: %q, want one WARN naming the bound", lines)
	}
}

// TestRefusedBlockIsHeldOff: a block whose bytes the reader refused once
// more after fetching them anew is dropped and held off: reads of it fail
// at once, without a GET, until its holdoff is over.
func TestRefusedBlockIsHeldOff(t *testing.T) {
	o, c, r := holdoffReader(t, time.Hour)
	readCheck(t, r, o, 0, 10)
	r.Refuse(100, 10)
	fetches := o.fetches.Load()
	if _, err := r.ReadAt(make([]byte, 10), 200); !errors.Is(err, ErrRefused) {
		t.Fatalf("read of a refused block: %v, want ErrRefused", err)
	}
	if o.fetches.Load() != fetches || c.Cached("obj", 0) || c.Stats().Refused != 1 {
		t.Fatalf("refused block: %d fetches more, cached %v, stats %+v; want none, not cached, 1 refused",
			o.fetches.Load()-fetches, c.Cached("obj", 0), c.Stats())
	}
	readCheck(t, r, o, testBlock, 10) // another block is fetched as usual
	// The store answering does not make the refused bytes good.
	if _, err := r.ReadAt(make([]byte, 10), 200); !errors.Is(err, ErrRefused) {
		t.Fatalf("read of a refused block after another block was fetched: %v, want ErrRefused", err)
	}
}

// TestReadAtHeldSaysWhetherBytesStayedInMemory: bytes of a block this
// process fetched are held while the block is in flight or in memory;
// once the block is written to disk, or found there after a reopen, a
// read of it is not held (its file could have been changed), and neither
// is a read that spans such a block.
func TestReadAtHeldSaysWhetherBytesStayedInMemory(t *testing.T) {
	dir := t.TempDir()
	o := newOrigin(t, 3*testBlock)
	c := openCache(t, dir, 64<<20)
	r := openReader(t, c, o.object("obj"))
	read := func(off, n int64) bool {
		t.Helper()
		buf := make([]byte, n)
		got, held, err := r.ReadAtHeld(context.Background(), buf, off)
		if err != nil || int64(got) != n || !bytes.Equal(buf, o.data[off:off+n]) {
			t.Fatalf("ReadAtHeld(%d, %d) = %d, %v; want the object's bytes", off, n, got, err)
		}
		return held
	}
	release := c.holdWrites()
	if !read(0, 100) || !read(10, testBlock-10) {
		t.Fatal("a block fetched and held in memory was not reported held")
	}
	release()
	waitFor(t, "block 0 on disk", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		e := c.entries[blockKey{"obj", 0}]
		return e != nil && e.onDisk
	})
	if read(0, 100) {
		t.Fatal("a block read back from its file was reported held")
	}
	release = c.holdWrites()
	defer release()
	if !read(testBlock, 100) {
		t.Fatal("a fresh block was not reported held")
	}
	if read(testBlock-50, 100) {
		t.Fatal("a read spanning a block from disk was reported held")
	}
	r.Close()
	release()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = openCache(t, dir, 64<<20)
	r = openReader(t, c, o.object("obj"))
	if read(testBlock, 100) {
		t.Fatal("a block found on disk at open was reported held")
	}
}
