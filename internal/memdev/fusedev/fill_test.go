package fusedev

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
)

// TestFillServesMappedFaultsFromCache fills part of the device and checks
// that a VMM mapping it reads the right bytes and that the filled pages
// cost no read request, while the pages outside the fill still do.
func TestFillServesMappedFaultsFromCache(t *testing.T) {
	const fileBytes = 8 << 20
	lower := writeLower(t, fileBytes, 11)
	srv := newServer(t, Options{})
	d := attach(t, srv, "fill", lower, memdev.IOEngineBuffered)
	defer func() { waitAck(t, d.release()) }()
	f, err := os.Open(d.Path()) // keeps the kernel inode, as restore does
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	buf := make([]byte, 1<<20)
	for off := int64(0); off < 4<<20; off += int64(len(buf)) {
		if err := d.Fill(off, buf); err != nil {
			t.Fatalf("Fill at %d: %v", off, err)
		}
	}
	filled := d.Counters()
	if filled.BytesRead != 4<<20 || filled.ReadRequests != 4 {
		t.Fatalf("filling 4 MiB in 1 MiB runs: %+v", filled)
	}

	l := layout.Single(fileBytes)
	var inside []int64
	for off := int64(0); off < 4<<20; off += 64 * pageBytes {
		inside = append(inside, off)
	}
	res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: inside})
	if res.Err != "" {
		t.Fatalf("child: %s", res.Err)
	}
	if want := lowerHash(t, lower, inside, pageBytes); res.Hash != want {
		t.Fatalf("mapped filled pages hash %s, lower file %s", res.Hash, want)
	}
	if got := d.Counters().Sub(filled); got.ReadRequests != 0 {
		t.Fatalf("faults on filled pages sent %d read requests, want 0", got.ReadRequests)
	}

	// Filling again skips what is cached; an unfilled page still reads.
	if err := d.Fill(0, buf); err != nil {
		t.Fatal(err)
	}
	if got := d.Counters().Sub(filled); got.BytesRead != 0 {
		t.Fatalf("refilling served pages read %d bytes from the lower file", got.BytesRead)
	}
	outside := []int64{6 << 20}
	res = runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: outside})
	if want := lowerHash(t, lower, outside, pageBytes); res.Err != "" || res.Hash != want {
		t.Fatalf("unfilled page: %+v, want hash %s", res, want)
	}
	if got := d.Counters().Sub(filled); got.ReadRequests == 0 {
		t.Fatal("a fault outside the fill sent no read request")
	}
	// The read marked what it served: a fill over it reads nothing new.
	before := d.Counters()
	if err := d.Fill(6<<20, buf[:pageBytes]); err != nil {
		t.Fatal(err)
	}
	if got := d.Counters().Sub(before); got.BytesRead != 0 {
		t.Fatalf("fill over a served page read %d bytes", got.BytesRead)
	}
}

func TestFillRefusedWithoutPageCache(t *testing.T) {
	lower := writeLower(t, 1<<20, 12)
	srv := newServer(t, Options{})
	direct := attach(t, srv, "direct", lower, memdev.IOEngineDirect)
	defer func() { waitAck(t, direct.release()) }()
	if err := direct.Fill(0, make([]byte, pageBytes)); !errors.Is(err, ErrNotCached) {
		t.Fatalf("fill with io_engine 2: %v, want ErrNotCached", err)
	}
	unopened := attach(t, srv, "unopened", lower, memdev.IOEngineBuffered)
	defer func() { waitAck(t, unopened.release()) }()
	if err := unopened.Fill(0, make([]byte, pageBytes)); !errors.Is(err, ErrNotCached) {
		t.Fatalf("fill before any lookup: %v, want ErrNotCached", err)
	}
	if err := unopened.Fill(2<<20, make([]byte, pageBytes)); err == nil {
		t.Fatal("fill past the end succeeded")
	}
}

// heldObserver holds the first prefetch it hears of, inside Served, until
// proceed closes: as a restore's timeline would be, were the fill's
// goroutine preempted there. It counts the demand requests it hears of.
type heldObserver struct {
	heard, proceed chan struct{}
	once           sync.Once
	demands        atomic.Int64
}

func (o *heldObserver) Served(kind memdev.Kind, off int64, n int, took time.Duration) {
	if kind == memdev.Demand {
		o.demands.Add(1)
		return
	}
	if kind == memdev.Prefetch {
		o.once.Do(func() {
			close(o.heard)
			<-o.proceed
		})
	}
}

// heldFill is a fill in flight whose first prefetch event its observer
// holds, so a test can look at the device between "heard of" and
// "stored". proceed lets it go on (once; it also runs at clean-up, so a
// failing test never leaves the fill blocked); filled gives its result.
type heldFill struct {
	filled  chan error
	proceed func()
}

// attachHeld attaches lower as name on srv with an observer that holds
// the first prefetch it hears of; the device is released at clean-up.
func attachHeld(t *testing.T, srv *Server, name, lower string) (*Device, *heldObserver) {
	t.Helper()
	obs := &heldObserver{heard: make(chan struct{}), proceed: make(chan struct{})}
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Observer = obs
	d, err := srv.Attach(name, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { waitAck(t, d.release()) })
	return d, obs
}

// startHeldFill starts d's fill of n bytes at off and returns once obs is
// hearing of it, or fails the test if the fill ended first.
func startHeldFill(t *testing.T, d *Device, obs *heldObserver, off int64, n int) heldFill {
	t.Helper()
	h := heldFill{filled: make(chan error, 1)}
	var once sync.Once
	h.proceed = func() { once.Do(func() { close(obs.proceed) }) }
	t.Cleanup(h.proceed)
	go func() { h.filled <- d.Fill(off, make([]byte, n)) }()
	select {
	case <-obs.heard:
	case err := <-h.filled:
		t.Fatalf("the fill ended (%v) before its observer heard of it", err)
	}
	return h
}

// TestFillIsHeardOfBeforeTheGuestCanFindIt: a guest that touches a page
// while the device has not yet told its observers of the fill that brought
// it in must find the page missing, and fault. Were the page already in
// the page cache, the guest could touch it (no request) and reach ready
// before the prefetch was recorded, and the restore's accounting, cut at
// ready, would count a page the guest used as neither prefetched nor
// requested: unused.
func TestFillIsHeardOfBeforeTheGuestCanFindIt(t *testing.T) {
	const fileBytes = 1 << 20
	lower := writeLower(t, fileBytes, 13)
	d, obs := attachHeld(t, newServer(t, Options{}), "heard", lower)
	f, err := os.Open(d.Path()) // keeps the kernel inode, as restore does
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fill := startHeldFill(t, d, obs, 0, 64<<10)
	page := []int64{0}
	res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes), Pages: page})
	if want := lowerHash(t, lower, page, pageBytes); res.Err != "" || res.Hash != want {
		t.Fatalf("guest touch: %+v, want hash %s", res, want)
	}
	if obs.demands.Load() == 0 {
		t.Error("the guest found the filled page in the cache before the fill was heard of")
	}
	fill.proceed()
	if err := <-fill.filled; err != nil {
		t.Fatalf("fill: %v", err)
	}
}
