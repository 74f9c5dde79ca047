package fusedev

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
)

const pageBytes = layout.DefaultPageSize

// newServer mounts a Server in a fresh directory and unmounts it at cleanup.
func newServer(t testing.TB, opts Options) *Server {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	srv, err := Mount(dir, opts)
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if _, mounted, _ := mountTypeAt(srv.Dir()); mounted {
			t.Errorf("%s still mounted after Close", srv.Dir())
		}
	})
	return srv
}

// writeLower writes a lower file of size random bytes, so a page served
// from the wrong offset cannot hash the same.
func writeLower(t testing.TB, size int64, seed uint64) string {
	t.Helper()
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	b := make([]byte, size)
	rand.NewChaCha8(key).Read(b)
	p := filepath.Join(t.TempDir(), "memory")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// lowerHash hashes pages of the lower file in order, as a child does.
func lowerHash(t *testing.T, path string, offsets []int64, readBytes int) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, readBytes)
	for _, off := range offsets {
		n, err := f.ReadAt(buf, off)
		if err != nil && n == 0 {
			t.Fatalf("read lower at %d: %v", off, err)
		}
		h.Write(buf[:n])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// randomPages picks n page offsets inside l's regions, repeats allowed.
func randomPages(l layout.Layout, n int, seed uint64) []int64 {
	r := rand.New(rand.NewPCG(seed, 7))
	pages := make([]int64, n)
	for i := range pages {
		reg := l.Regions[r.IntN(len(l.Regions))]
		pages[i] = reg.Offset + int64(r.IntN(int(reg.Size/pageBytes)))*pageBytes
	}
	return pages
}

// fileReq asks for the local memory file at path with ioEngine.
func fileReq(path string, ioEngine int) memdev.Request {
	return memdev.Request{Memory: memdev.File(path), IOEngine: ioEngine}
}

// funcSource is memory named ref whose lower open makes.
type funcSource struct {
	ref  string
	open func() (memdev.Lower, error)
}

func (s funcSource) Ref() string                 { return s.ref }
func (s funcSource) Open() (memdev.Lower, error) { return s.open() }

// lowerReq asks for the memory named ref whose lower open makes.
func lowerReq(ref string, open func() (memdev.Lower, error), ioEngine int) memdev.Request {
	return memdev.Request{Memory: funcSource{ref, open}, IOEngine: ioEngine}
}

func attach(t *testing.T, srv *Server, key, lower string, ioEngine int) *Device {
	t.Helper()
	d, err := srv.Attach(key, fileReq(lower, ioEngine))
	if err != nil {
		t.Fatalf("Attach(%q, io_engine %d): %v", key, ioEngine, err)
	}
	return d
}

func waitAck(t testing.TB, ack <-chan struct{}) {
	t.Helper()
	select {
	case <-ack:
	case <-time.After(resultTimeout):
		t.Fatal("release was never acknowledged")
	}
}

func TestMappedReadsMatchLowerFile(t *testing.T) {
	const fileBytes = 48 << 20
	lower := writeLower(t, fileBytes, 1)
	// Two regions with a hole between them, as a guest above 3 GiB has.
	lay := layout.Layout{FileSize: fileBytes, Regions: []layout.Region{
		{Offset: 0, Size: 20 << 20, PageSize: pageBytes},
		{Offset: 24 << 20, Size: 24 << 20, PageSize: pageBytes},
	}}
	if err := lay.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, Options{})
	for _, engine := range []int{memdev.IOEngineBuffered, memdev.IOEngineBufferedAsync, memdev.IOEngineDirect} {
		for _, seed := range []uint64{11, 12} {
			pages := randomPages(lay, 3000, seed+uint64(engine)*100)
			want := lowerHash(t, lower, pages, pageBytes)
			d := attach(t, srv, "snap", lower, engine)

			mapped := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: lay, Pages: pages})
			if mapped.Err != "" || mapped.Hash != want {
				t.Errorf("io_engine %d seed %d mmap: hash %s err %q, want %s", engine, seed, mapped.Hash, mapped.Err, want)
			}
			read := runChildSpec(t, childSpec{Mode: childRead, Path: d.Path(), Pages: pages})
			if read.Err != "" || read.Hash != want {
				t.Errorf("io_engine %d seed %d read: hash %s err %q, want %s", engine, seed, read.Hash, read.Err, want)
			}
			if c := d.Counters(); c.ReadRequests == 0 || c.BytesRead == 0 || c.ReadErrors != 0 || c.BytesInFlight != 0 {
				t.Errorf("io_engine %d seed %d: counters %+v", engine, seed, c)
			}
			waitAck(t, d.release())
		}
	}
}

// evictionSliver is how much of n a test that expects a warm page cache
// allows to come from the device again: the host reclaims page cache
// under its own policy (DAMON pageout here), so a page cached a moment
// ago may be gone. One percent is far below what a cache that is not
// shared would cost (every page again), so the property stays tested.
func evictionSliver(n int64) int64 { return n / 100 }

func TestKeepCacheSharesPageCache(t *testing.T) {
	const fileBytes = 32 << 20
	lower := writeLower(t, fileBytes, 2)
	lay := layout.Single(fileBytes)
	pages := randomPages(lay, 1500, 21)
	want := lowerHash(t, lower, pages, pageBytes)
	srv := newServer(t, Options{})

	t.Run("one after the other", func(t *testing.T) {
		d := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
		defer func() { waitAck(t, d.release()) }()
		spec := childSpec{Mode: childMmap, Path: d.Path(), Layout: lay, Pages: pages}
		if res := runChildSpec(t, spec); res.Hash != want {
			t.Fatalf("first VMM: hash %s err %q, want %s", res.Hash, res.Err, want)
		}
		one := d.Counters()
		if res := runChildSpec(t, spec); res.Hash != want {
			t.Fatalf("second VMM: hash %s err %q, want %s", res.Hash, res.Err, want)
		}
		if extra := d.Counters().Sub(one); extra.BytesRead > uint64(evictionSliver(int64(one.BytesRead))) {
			t.Errorf("second VMM read %d bytes from the lower file, want none but what the host evicted (first read %d)", extra.BytesRead, one.BytesRead)
		}
	})

	t.Run("concurrently", func(t *testing.T) {
		// The first VMM alone, on its own generation, sets the budget.
		solo := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
		spec := childSpec{Mode: childMmap, Path: solo.Path(), Layout: lay, Pages: pages}
		runChildSpec(t, spec)
		one := solo.Counters().BytesRead
		waitAck(t, solo.release())

		d := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
		defer func() { waitAck(t, d.release()) }()
		if d.Generation() <= solo.Generation() {
			t.Fatalf("generation %d after %d", d.Generation(), solo.Generation())
		}
		spec.Path = d.Path()
		a, b := startChild(t, spec), startChild(t, spec)
		for i, c := range []*child{a, b} {
			if res := c.result(); res.Hash != want {
				t.Errorf("VMM %d: hash %s err %q, want %s", i, res.Hash, res.Err, want)
			}
		}
		// Readaround windows of two VMMs faulting at once may split
		// differently, never read a page twice: allow a sliver.
		total := d.Counters().BytesRead
		if margin := one/20 + 1<<20; total > one+margin {
			t.Errorf("two VMMs read %d bytes, one alone %d (margin %d)", total, one, margin)
		}
	})

	t.Run("buffered reads warm mappings", func(t *testing.T) {
		d := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
		defer func() { waitAck(t, d.release()) }()
		var whole []int64
		for off := int64(0); off < fileBytes; off += 1 << 20 {
			whole = append(whole, off)
		}
		if res := runChildSpec(t, childSpec{Mode: childRead, Path: d.Path(), Pages: whole, ReadBytes: 1 << 20}); res.Err != "" {
			t.Fatalf("prefetch-like reader: %s", res.Err)
		}
		warmed := d.Counters()
		if warmed.BytesRead < fileBytes {
			t.Fatalf("reader read %d bytes, want at least %d", warmed.BytesRead, fileBytes)
		}
		if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: lay, Pages: pages}); res.Hash != want {
			t.Fatalf("VMM: hash %s err %q, want %s", res.Hash, res.Err, want)
		}
		if extra := d.Counters().Sub(warmed); int64(extra.ReadRequests) > evictionSliver(int64(len(pages))) {
			t.Errorf("VMM after a full buffered read still sent %d requests for %d pages, want none but what the host evicted", extra.ReadRequests, len(pages))
		}
	})
}

func TestDirectIO(t *testing.T) {
	const fileBytes = 16 << 20
	lower := writeLower(t, fileBytes, 3)
	lay := layout.Single(fileBytes)
	pages := randomPages(lay, 800, 31)
	want := lowerHash(t, lower, pages, pageBytes)
	srv := newServer(t, Options{})
	d := attach(t, srv, "snap", lower, memdev.IOEngineDirect)
	defer func() { waitAck(t, d.release()) }()

	if err := CheckMappable(d.Path()); err != nil {
		t.Fatalf("CheckMappable on io_engine 2: %v (MAP_PRIVATE of a direct I/O file is documented to work)", err)
	}
	spec := childSpec{Mode: childMmap, Path: d.Path(), Layout: lay, Pages: pages}
	if res := runChildSpec(t, spec); res.Hash != want {
		t.Fatalf("first VMM: hash %s err %q, want %s", res.Hash, res.Err, want)
	}
	one := d.Counters()
	if res := runChildSpec(t, spec); res.Hash != want {
		t.Fatalf("second VMM: hash %s err %q, want %s", res.Hash, res.Err, want)
	}
	// Each mmap of a direct I/O file drops its page cache.
	if again := d.Counters().Sub(one); again.BytesRead < one.BytesRead*9/10 {
		t.Errorf("second VMM read %d bytes from the lower file, first %d: page cache was shared", again.BytesRead, one.BytesRead)
	}

	// read(2) goes straight to the server, one request per call, and warms nothing.
	before := d.Counters()
	offs := []int64{0, 1 << 20, 2 << 20, 1 << 20}
	if res := runChildSpec(t, childSpec{Mode: childRead, Path: d.Path(), Pages: offs, ReadBytes: 1 << 20}); res.Err != "" {
		t.Fatal(res.Err)
	}
	if got := d.Counters().Sub(before); got.ReadRequests != uint64(len(offs)) || got.BytesRead != uint64(len(offs))<<20 {
		t.Errorf("4 direct reads of 1 MiB: %d requests, %d bytes", got.ReadRequests, got.BytesRead)
	}

	shared := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: lay, Pages: pages[:1], Shared: true})
	if shared.Errno != int(unix.ENODEV) {
		t.Errorf("MAP_SHARED of a direct I/O file: errno %d (%s), want ENODEV", shared.Errno, shared.Err)
	}
}

func TestReleaseWaitsForBlockedRead(t *testing.T) {
	const fileBytes = 8 << 20
	lower := writeLower(t, fileBytes, 4)
	const target = 5 << 20
	var (
		gen     atomic.Uint64
		once    sync.Once
		entered = make(chan struct{})
		unblock = make(chan struct{})
	)
	srv := newServer(t, Options{ReadHook: func(g uint64, off int64, n int) {
		if g != gen.Load() || target < off || target >= off+int64(n) {
			return
		}
		once.Do(func() {
			close(entered)
			<-unblock
		})
	}})
	// A failing test must not leave the read blocked: Close would wait for it.
	var unblockOnce sync.Once
	release := func() { unblockOnce.Do(func() { close(unblock) }) }
	t.Cleanup(release)
	d := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
	gen.Store(d.Generation())
	path := d.Path()

	// late opens the file now and reads only after the release began.
	late := startChild(t, childSpec{Mode: childRead, Path: path, Pages: []int64{1 << 20}, Pause: true})
	late.waitPaused()
	c := startChild(t, childSpec{Mode: childMmap, Path: path, Layout: layout.Single(fileBytes), Pages: []int64{target}})
	select {
	case <-entered:
	case <-time.After(resultTimeout):
		t.Fatal("the VMM's fault never reached the server")
	}
	if c := d.Counters(); c.BytesInFlight <= 0 {
		t.Errorf("blocked read: bytes in flight %d", c.BytesInFlight)
	}
	ack := d.release()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat of a released device file: %v, want ENOENT", err)
	}
	if again := d.release(); again != ack {
		t.Error("second Release returned a different channel")
	}
	// The lookup above took a round trip through the server: a release
	// that did not wait would have been acknowledged by now.
	select {
	case <-ack:
		t.Fatal("release acknowledged while a read is blocked inside the server")
	default:
	}
	if c := d.Counters(); c.BytesInFlight <= 0 {
		t.Errorf("blocked read after release: bytes in flight %d", c.BytesInFlight)
	}
	// A read that arrives while the release drains is refused, not served.
	late.resume()
	if res := late.result(); res.Errno != int(unix.EIO) {
		t.Errorf("read arriving during the drain: errno %d (%s), want EIO", res.Errno, res.Err)
	}
	release()
	waitAck(t, ack)
	if c := d.Counters(); c.BytesInFlight != 0 || c.ReadRequests == 0 || c.ReadErrors != 0 {
		t.Errorf("after acknowledgement: counters %+v", c)
	}
	want := lowerHash(t, lower, []int64{target}, pageBytes)
	if res := c.result(); res.Hash != want {
		t.Errorf("VMM whose read was held: hash %s err %q, want %s", res.Hash, res.Err, want)
	}
}

func TestReadAfterReleaseFails(t *testing.T) {
	lower := writeLower(t, 4<<20, 12)
	srv := newServer(t, Options{})
	d := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
	// The file is opened before the release and read after it.
	c := startChild(t, childSpec{Mode: childRead, Path: d.Path(), Pages: []int64{1 << 20}, Pause: true})
	c.waitPaused()
	waitAck(t, d.release())
	c.resume()
	if res := c.result(); res.Errno != int(unix.EIO) {
		t.Errorf("read of a released device: errno %d (%s), want EIO", res.Errno, res.Err)
	}
}

func TestLowerFileTruncated(t *testing.T) {
	const fileBytes = 16 << 20
	lower := writeLower(t, fileBytes, 5)
	srv := newServer(t, Options{})
	d := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
	defer func() { waitAck(t, d.release()) }()

	// The VMM touches a page, the lower file shrinks, the VMM touches a
	// page past the new end, far beyond any readaround of the first.
	vmm := startChild(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes),
		Pages: []int64{0, 12 << 20}, Pause: true, PauseAt: 1})
	vmm.waitPaused()
	if err := os.Truncate(lower, 1<<20); err != nil {
		t.Fatal(err)
	}
	vmm.resume()
	if res := vmm.result(); !res.Fault || res.Touched != 1 {
		t.Errorf("VMM touching a page the lower file lost: fault %v touched %d err %q, want a fault after 1", res.Fault, res.Touched, res.Err)
	}
	reader := runChildSpec(t, childSpec{Mode: childRead, Path: d.Path(), Pages: []int64{10 << 20}})
	if reader.Errno != int(unix.EIO) {
		t.Errorf("read past the truncated lower file: errno %d (%s), want EIO", reader.Errno, reader.Err)
	}
	if c := d.Counters(); c.ReadErrors < 2 || c.BytesInFlight != 0 {
		t.Errorf("counters %+v, want at least 2 read errors", c)
	}

	// The server keeps serving other devices.
	other := writeLower(t, 4<<20, 6)
	o := attach(t, srv, "other", other, memdev.IOEngineBuffered)
	defer func() { waitAck(t, o.release()) }()
	pages := randomPages(layout.Single(4<<20), 100, 61)
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: o.Path(), Layout: layout.Single(4 << 20), Pages: pages}); res.Hash != lowerHash(t, other, pages, pageBytes) {
		t.Errorf("another device after a lower-file failure: hash %s err %q", res.Hash, res.Err)
	}
}

func TestGenerations(t *testing.T) {
	lower := writeLower(t, 1<<20, 7)
	srv := newServer(t, Options{})

	a := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
	b := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
	if a.Generation() != b.Generation() || a.Path() != b.Path() {
		t.Fatalf("same key attached twice: generations %d, %d; paths %s, %s", a.Generation(), b.Generation(), a.Path(), b.Path())
	}
	if a.Size() != 1<<20 || a.IOEngine() != memdev.IOEngineBuffered {
		t.Errorf("size %d io_engine %d", a.Size(), a.IOEngine())
	}
	other := attach(t, srv, "other", lower, memdev.IOEngineDirect)
	if other.Generation() == a.Generation() {
		t.Errorf("two keys share generation %d", a.Generation())
	}
	if _, err := srv.Attach("snap", fileReq(lower, memdev.IOEngineDirect)); !errors.Is(err, ErrAttachConflict) {
		t.Errorf("attach with another io_engine: %v, want ErrAttachConflict", err)
	}

	ackA := a.release()
	select {
	case <-ackA:
	default:
		t.Fatal("releasing a reference that is not the last was not acknowledged at once")
	}
	if a.release() != ackA {
		t.Error("second Release returned a different channel")
	}
	// a's double release must not have dropped b's reference.
	if _, err := os.Stat(b.Path()); err != nil {
		t.Fatalf("device file with a live reference: %v", err)
	}
	fi, err := os.Stat(b.Path())
	if err != nil || fi.Size() != 1<<20 || fi.Mode().Perm() != 0o444 || !fi.Mode().IsRegular() {
		t.Errorf("device file: %v, %v", fi, err)
	}
	if _, err := os.OpenFile(b.Path(), os.O_RDWR, 0); !errors.Is(err, syscall.EROFS) {
		t.Errorf("writable open: %v, want EROFS", err)
	}

	old, oldPath := b.Generation(), b.Path()
	waitAck(t, b.release())
	if _, err := os.Open(oldPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("open after the last release: %v, want ENOENT", err)
	}
	c := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
	defer func() { waitAck(t, c.release()) }()
	if c.Generation() <= old || c.Generation() <= other.Generation() || c.Path() == oldPath {
		t.Errorf("re-attach: generation %d path %s after generation %d path %s", c.Generation(), c.Path(), old, oldPath)
	}
	waitAck(t, other.release())

	entries, err := os.ReadDir(srv.Dir())
	if err != nil || len(entries) != 1 || filepath.Join(srv.Dir(), entries[0].Name()) != c.Path() {
		t.Errorf("mount lists %v (%v), want only %s", entries, err, c.Path())
	}
}

func TestWritableOpens(t *testing.T) {
	const fileBytes = 4 << 20
	lower := writeLower(t, fileBytes, 13)
	lay := layout.Single(fileBytes)
	// Each page once: a page read again after the write would differ.
	var pages []int64
	for off := int64(fileBytes - pageBytes); off >= 0; off -= 5 * pageBytes {
		pages = append(pages, off)
	}
	want := lowerHash(t, lower, pages, pageBytes)
	wantWhole := lowerHash(t, lower, []int64{0}, fileBytes)
	srv := newServer(t, Options{AllowWriteOpen: true})
	d := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
	defer func() { waitAck(t, d.release()) }()

	// A VMM that opens the file for writing and writes its private copy.
	vmm := childSpec{Mode: childMmap, Path: d.Path(), Layout: lay, Pages: pages, ReadWrite: true, Write: true}
	if res := runChildSpec(t, vmm); res.Err != "" || res.Hash != want {
		t.Fatalf("writing VMM: hash %s err %q, want %s", res.Hash, res.Err, want)
	}
	if res := runChildSpec(t, childSpec{Mode: childWrite, Path: d.Path(), Pages: []int64{0}}); res.Errno != int(unix.EROFS) {
		t.Errorf("pwrite: errno %d (%s), want EROFS", res.Errno, res.Err)
	}
	if _, err := os.OpenFile(d.Path(), os.O_RDWR|os.O_TRUNC, 0); !errors.Is(err, syscall.EROFS) {
		t.Errorf("open with O_TRUNC: %v, want EROFS", err)
	}
	// Neither the shared page cache nor the lower file saw a write.
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: lay, Pages: pages}); res.Hash != want {
		t.Errorf("VMM after a writing VMM: hash %s err %q, want %s", res.Hash, res.Err, want)
	}
	if got := lowerHash(t, lower, []int64{0}, fileBytes); got != wantWhole {
		t.Error("the lower file changed")
	}
}

func TestAttachRejects(t *testing.T) {
	lower := writeLower(t, 1<<20, 8)
	srv := newServer(t, Options{})
	for _, tc := range []struct {
		name     string
		key      string
		lower    string
		ioEngine int
		want     error
	}{
		{"empty key", "", lower, 0, ErrInvalidKey},
		{"slash in key", "a/b", lower, 0, ErrInvalidKey},
		{"dot key", "..", lower, 0, ErrInvalidKey},
		{"io_engine 3", "k", lower, 3, ErrInvalidIOEngine},
		{"missing lower file", "k", filepath.Join(t.TempDir(), "absent"), 0, os.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := srv.Attach(tc.key, fileReq(tc.lower, tc.ioEngine)); !errors.Is(err, tc.want) {
				t.Errorf("Attach: %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := srv.Attach("dir", fileReq(t.TempDir(), 0)); err == nil {
		t.Error("attach of a directory succeeded")
	}
	held := attach(t, srv, "held", lower, 0)
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := srv.Attach("k", fileReq(lower, 0)); !errors.Is(err, ErrClosed) {
		t.Errorf("Attach after Close: %v, want ErrClosed", err)
	}
	waitAck(t, held.release())
}

func TestTraceRecordsFirstTouches(t *testing.T) {
	const fileBytes = 16 << 20
	lower := writeLower(t, fileBytes, 9)
	srv := newServer(t, Options{})

	t.Run("direct reads", func(t *testing.T) {
		// Direct I/O sends each read as one request: the trace is exact.
		d := attach(t, srv, "direct", lower, memdev.IOEngineDirect)
		defer func() { waitAck(t, d.release()) }()
		runChildSpec(t, childSpec{Mode: childRead, Path: d.Path(), Pages: []int64{0}})
		d.StartTrace()
		offs := []int64{9 * pageBytes, 2 * pageBytes, 9 * pageBytes, 100 * pageBytes, 2 * pageBytes}
		res := runChildSpec(t, childSpec{Mode: childRead, Path: d.Path(), Pages: offs, ReadBytes: 2 * pageBytes})
		if res.Err != "" {
			t.Fatal(res.Err)
		}
		mid := d.Trace()
		trace := d.StopTrace()
		runChildSpec(t, childSpec{Mode: childRead, Path: d.Path(), Pages: []int64{50 * pageBytes}})
		want := []int64{9, 10, 2, 3, 100, 101}
		var got []int64
		for i, tc := range trace {
			got = append(got, tc.Offset/pageBytes)
			if i > 0 && tc.Nanos < trace[i-1].Nanos {
				t.Errorf("touch %d at %d ns before touch %d at %d ns", i, tc.Nanos, i-1, trace[i-1].Nanos)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("trace pages %v, want %v", got, want)
		}
		if !slices.Equal(mid, trace) {
			t.Errorf("Trace before StopTrace %v, StopTrace %v", mid, trace)
		}
		if after := d.Trace(); len(after) != len(trace) {
			t.Errorf("a read after StopTrace was traced: %v", after)
		}
	})

	t.Run("mapped faults", func(t *testing.T) {
		d := attach(t, srv, "mapped", lower, memdev.IOEngineBuffered)
		defer func() { waitAck(t, d.release()) }()
		d.StartTrace()
		// Pages far enough apart that no readaround window holds two.
		touched := []int64{11 << 20, 3 << 20, 7 << 20, 1 << 20, 14 << 20}
		if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes), Pages: touched}); res.Err != "" {
			t.Fatal(res.Err)
		}
		trace := d.StopTrace()
		pos := make(map[int64]int)
		for i, tc := range trace {
			if tc.Offset%pageBytes != 0 {
				t.Errorf("touch %d at unaligned offset %d", i, tc.Offset)
			}
			if _, dup := pos[tc.Offset]; dup {
				t.Errorf("page %d touched twice", tc.Offset)
			}
			pos[tc.Offset] = i
		}
		last := -1
		for _, off := range touched {
			i, ok := pos[off]
			if !ok {
				t.Fatalf("faulted page %d missing from trace", off)
			}
			if i <= last {
				t.Errorf("page %d recorded at %d, before the page faulted ahead of it (%d)", off, i, last)
			}
			last = i
		}
	})
}

func TestMountCleansStaleMount(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "mnt")
	crashed := startChild(t, childSpec{Mode: childMount, Dir: dir})
	crashed.waitPaused()
	if err := crashed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	crashed.cmd.Wait()
	// Whatever happens below, leave no dead mount behind.
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); !errors.Is(err, unix.ENOTCONN) {
		t.Fatalf("statfs of a crashed server's mount: %v, want ENOTCONN", err)
	}

	srv, err := Mount(dir, Options{})
	if err != nil {
		t.Fatalf("Mount over a stale mount: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	if _, err := Mount(dir, Options{}); !errors.Is(err, ErrMountBusy) {
		t.Errorf("Mount over a live mount: %v, want ErrMountBusy", err)
	}
	lower := writeLower(t, 1<<20, 10)
	d := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
	defer func() { waitAck(t, d.release()) }()
	pages := []int64{0, 5 * pageBytes}
	if res := runChildSpec(t, childSpec{Mode: childRead, Path: d.Path(), Pages: pages}); res.Hash != lowerHash(t, lower, pages, pageBytes) {
		t.Errorf("read through the new mount: hash %s err %q", res.Hash, res.Err)
	}
}

// TestServerExitsWithItsOwnFileOpen: a process that serves the device and
// holds its own device file open (a restore's prefetch does) exits when
// killed. The kernel closes its files in descriptor order; closing a FUSE
// file sends FLUSH and waits for the answer, so a device file closed
// before the process's /dev/fuse descriptor waited for ever on a server
// that was already gone, and the process could not be reaped.
func TestServerExitsWithItsOwnFileOpen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "mnt")
	lower := writeLower(t, 1<<20, 11)
	server := startChild(t, childSpec{Mode: childMountOpen, Dir: dir, Path: lower})
	server.waitPaused()
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if err := server.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { server.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		abortConnection(t, uint64(st.Dev))
		<-exited
		t.Fatal("a killed server holding its own device file open did not exit")
	}
}

// abortConnection aborts FUSE connection dev through a fusectl mount of
// the test's own, which ends whatever still waits on it.
func abortConnection(t *testing.T, dev uint64) {
	ctl := t.TempDir()
	if err := unix.Mount("fusectl", ctl, "fusectl", 0, ""); err != nil {
		t.Fatalf("mount fusectl to abort connection %d: %v", dev, err)
	}
	defer unix.Unmount(ctl, unix.MNT_DETACH)
	if err := os.WriteFile(filepath.Join(ctl, strconv.FormatUint(dev, 10), "abort"), []byte("1"), 0); err != nil {
		t.Fatalf("abort connection %d: %v", dev, err)
	}
}

// TestCleanStale detaches the dead mounts of crashed servers below a
// directory and refuses a live one.
func TestCleanStale(t *testing.T) {
	root := t.TempDir()
	dirs := []string{filepath.Join(root, "a", "mnt"), filepath.Join(root, "b")}
	for _, dir := range dirs {
		crashed := startChild(t, childSpec{Mode: childMount, Dir: dir})
		crashed.waitPaused()
		if err := crashed.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		crashed.cmd.Wait()
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	}
	if points, _ := mountPointsUnder(root); len(points) != len(dirs) {
		t.Fatalf("mounts under %s before cleaning: %v, want %v", root, points, dirs)
	}
	if err := CleanStale(root); err != nil {
		t.Fatalf("CleanStale: %v", err)
	}
	if points, _ := mountPointsUnder(root); len(points) != 0 {
		t.Fatalf("mounts left under %s: %v", root, points)
	}
	if err := CleanStale(root); err != nil {
		t.Errorf("CleanStale with nothing mounted: %v", err)
	}

	live, err := Mount(filepath.Join(root, "live"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := CleanStale(root); !errors.Is(err, ErrMountBusy) {
		t.Errorf("CleanStale over a live mount: %v, want ErrMountBusy", err)
	}
	if _, mounted, _ := mountTypeAt(live.Dir()); !mounted {
		t.Error("CleanStale detached a live mount")
	}
	if err := live.Close(); err != nil {
		t.Fatal(err)
	}

	// Another file system is neither detached nor safe to remove.
	other := filepath.Join(root, "tmp")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", other, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	defer unix.Unmount(other, unix.MNT_DETACH)
	if err := CleanStale(root); err == nil || !strings.Contains(err.Error(), other) {
		t.Errorf("CleanStale over a tmpfs: %v, want an error naming %s", err, other)
	}
	if fstype, mounted, _ := mountTypeAt(other); !mounted || fstype != "tmpfs" {
		t.Errorf("tmpfs at %s: mounted %v as %q after CleanStale", other, mounted, fstype)
	}
}

func TestCloseWhileMapped(t *testing.T) {
	const fileBytes = 8 << 20
	lower := writeLower(t, fileBytes, 11)
	srv := newServer(t, Options{})
	d := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
	pages := []int64{0, 6 << 20}
	vmm := startChild(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes), Pages: pages, Pause: true, PauseAt: 1})
	vmm.waitPaused()
	if err := srv.Close(); err != nil {
		t.Fatalf("Close with a mapped device file: %v", err)
	}
	if _, mounted, _ := mountTypeAt(srv.Dir()); mounted {
		t.Fatal("still mounted after Close")
	}
	// The mapping outlives the mount and is still served.
	vmm.resume()
	if res := vmm.result(); res.Hash != lowerHash(t, lower, pages, pageBytes) {
		t.Errorf("VMM after Close: hash %s err %q", res.Hash, res.Err)
	}
	waitAck(t, d.release())
}

func TestReadAheadWindow(t *testing.T) {
	const fileBytes = 16 << 20
	lower := writeLower(t, fileBytes, 14)
	for _, tc := range []struct {
		name  string
		bytes int
		want  int
	}{
		{"default", 0, DefaultReadAheadBytes},
		{"above the FUSE_INIT limit", 512 << 10, 512 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var largest atomic.Int64
			srv := newServer(t, Options{ReadAheadBytes: tc.bytes, ReadHook: func(_ uint64, _ int64, n int) {
				if int64(n) > largest.Load() {
					largest.Store(int64(n))
				}
			}})
			if got := srv.ReadAheadBytes(); got != tc.want {
				t.Errorf("kernel readahead %d, want %d", got, tc.want)
			}
			d := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
			defer func() { waitAck(t, d.release()) }()
			// One fault in a cold file reads the window around it.
			if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes), Pages: []int64{8 << 20}}); res.Err != "" {
				t.Fatal(res.Err)
			}
			if got := largest.Load(); got != int64(tc.want) {
				t.Errorf("fault readaround request of %d bytes, want %d", got, tc.want)
			}
		})
	}
}

// A mount whose server is stopped (SIGSTOP), not dead, never blocks
// CleanStale or Mount: both give up after ProbeTimeout and leave the mount.
func TestProbeOfAStoppedServerTimesOut(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "mnt")
	stopped := startChild(t, childSpec{Mode: childMount, Dir: dir})
	stopped.waitPaused()
	if err := stopped.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopped.cmd.Process.Signal(syscall.SIGCONT)
		stopped.cmd.Process.Kill()
		stopped.cmd.Wait()
		unix.Unmount(dir, unix.MNT_DETACH)
	})
	// kill(2) only queues SIGSTOP: a server thread not yet stopped would
	// still answer the probe.
	waitAllThreadsStopped(t, stopped.cmd.Process.Pid)
	for name, probe := range map[string]func() error{
		"CleanStale": func() error { return CleanStale(root) },
		"Mount": func() error {
			s, err := Mount(dir, Options{})
			if err == nil {
				s.Close()
			}
			return err
		},
	} {
		start := time.Now()
		err := probe()
		if !errors.Is(err, ErrMountUnresponsive) || !errors.Is(err, ErrMountBusy) {
			t.Errorf("%s over a stopped server's mount: %v, want ErrMountUnresponsive", name, err)
		}
		if took := time.Since(start); took > ProbeTimeout+5*time.Second {
			t.Errorf("%s took %v, want about %v", name, took, ProbeTimeout)
		}
	}
	if _, mounted, _ := mountTypeAt(dir); !mounted {
		t.Error("the stopped server's mount was detached")
	}
}

// waitAllThreadsStopped waits until every thread of pid is in the stopped
// state (T in /proc/PID/task/TID/stat), or fails the test after 10 s.
func waitAllThreadsStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !allThreadsStopped(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d: not every thread stopped within 10s of SIGSTOP", pid)
		}
		runtime.Gosched()
	}
}

func allThreadsStopped(pid int) bool {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(stats) == 0 {
		return false
	}
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses
		// and may itself hold spaces or parentheses.
		i := bytes.LastIndexByte(data, ')')
		if i < 0 || i+2 >= len(data) || (data[i+2] != 'T' && data[i+2] != 't') {
			return false
		}
	}
	return true
}
