package fusedev

import (
	"os"
	"testing"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
)

// served is one range a device served.
type served struct {
	kind memdev.Kind
	off  int64
	n    int
}

// servedEvents passes on what a device serves.
type servedEvents chan served

func (s servedEvents) Served(kind memdev.Kind, off int64, n int, _ time.Duration) {
	s <- served{kind, off, n}
}

// missFillServer is a one-page-window mount, as the prefetching mount, that
// fills window bytes around a demand miss.
func missFillServer(t *testing.T, window int) *Server {
	return newServer(t, Options{ReadAheadBytes: pageBytes, MissFillBytes: window})
}

// TestDemandMissFillsItsNeighbours: on a one-page-window mount, a guest's
// fault is one page read on demand, and once it is answered the device
// fills the window around it, so the guest's next faults nearby cost no
// read request, as the serving mount's readaround would have given it.
func TestDemandMissFillsItsNeighbours(t *testing.T) {
	const fileBytes = 8 << 20
	lower := writeLower(t, fileBytes, 31)
	srv := missFillServer(t, 128<<10)
	events := make(servedEvents, 64)
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Observer = events
	d, err := srv.Attach("miss", req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, d.release()) }()
	f, err := os.Open(d.Path()) // keeps the kernel inode, as restore does
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	l := layout.Single(fileBytes)
	const miss = 3 << 20
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: []int64{miss}}); res.Err != "" {
		t.Fatalf("child: %s", res.Err)
	}
	// The fault reaches the device as its one page; the fill around it,
	// on both sides, is prefetch.
	if e := waitServed(t, events); e != (served{memdev.Demand, miss, pageBytes}) {
		t.Fatalf("first event %+v, want the one-page demand read at %d", e, miss)
	}
	var around int
	for around < 128<<10-pageBytes {
		e := waitServed(t, events)
		if e.kind != memdev.Prefetch || e.off < miss-64<<10 || e.off+int64(e.n) > miss+64<<10 {
			t.Fatalf("event %+v after the miss, want a fill of the 128 KiB around it", e)
		}
		around += e.n
	}
	filled := d.Counters()
	var near []int64
	for off := int64(miss - 60<<10); off < miss+60<<10; off += pageBytes {
		if off != miss {
			near = append(near, off)
		}
	}
	res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: near})
	if want := lowerHash(t, lower, near, pageBytes); res.Err != "" || res.Hash != want {
		t.Fatalf("neighbours of the miss: %+v, want hash %s", res, want)
	}
	if got := d.Counters().Sub(filled); got.ReadRequests != 0 {
		t.Fatalf("faults next to a filled miss sent %d read requests, want 0", got.ReadRequests)
	}
}

// TestNoMissFillWithoutAWiderWindow: a mount without MissFillBytes (the
// recorder's, whose trace needs every touch) serves each fault alone.
func TestNoMissFillWithoutAWiderWindow(t *testing.T) {
	const fileBytes = 4 << 20
	lower := writeLower(t, fileBytes, 32)
	srv := missFillServer(t, 0)
	d := attach(t, srv, "exact", lower, memdev.IOEngineBuffered)
	defer func() { waitAck(t, d.release()) }()
	l := layout.Single(fileBytes)
	pages := []int64{1 << 20, 1<<20 + pageBytes, 1<<20 + 2*pageBytes}
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: pages}); res.Err != "" {
		t.Fatalf("child: %s", res.Err)
	}
	if got := d.Counters(); got.ReadRequests != 3 || got.BytesRead != 3*pageBytes {
		t.Fatalf("three touched pages read %+v, want three one-page requests", got)
	}
}

func waitServed(t *testing.T, events servedEvents) served {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(resultTimeout):
		t.Fatal("the device served nothing more")
		return served{}
	}
}

// missFillDevice attaches a fileBytes lower to a one-page-window mount
// that fills window bytes around a miss, with its served events, and
// keeps the device file open (the kernel's inode), as restore does.
func missFillDevice(t *testing.T, fileBytes int64, window int) (*Device, string, servedEvents) {
	t.Helper()
	lower := writeLower(t, fileBytes, 33)
	srv := missFillServer(t, window)
	events := make(servedEvents, 1024)
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Observer = events
	d, err := srv.Attach("run", req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { waitAck(t, d.release()) })
	f, err := os.Open(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return d, lower, events
}

// faultAndFill has a child fault the one page at off, checks that it
// reached the device as that page, and waits for the fill that follows
// it: wantFilled bytes of prefetch, every byte of them in [lo, hi).
func faultAndFill(t *testing.T, d *Device, events servedEvents, fileBytes, off, lo, hi int64, wantFilled int) {
	t.Helper()
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes), Pages: []int64{off}}); res.Err != "" {
		t.Fatalf("child: %s", res.Err)
	}
	if e := waitServed(t, events); e != (served{memdev.Demand, off, pageBytes}) {
		t.Fatalf("event %+v, want the one-page demand read at %d", e, off)
	}
	for filled := 0; filled < wantFilled; {
		e := waitServed(t, events)
		if e.kind != memdev.Prefetch || e.off < lo || e.off+int64(e.n) > hi {
			t.Fatalf("event %+v after the miss at %d, want a fill within [%d, %d)", e, off, lo, hi)
		}
		filled += e.n
	}
}

// TestMissRunGrowsItsFill: a miss that lands where the fill of the
// previous one ended is a run the manifest did not know; its fill goes
// forward and doubles with each such miss, up to missRunMaxFactor
// windows, so a guest running through a long unknown stretch faults
// ever more rarely, while an isolated miss keeps the window around it.
func TestMissRunGrowsItsFill(t *testing.T) {
	const (
		fileBytes = 16 << 20
		window    = 128 << 10
	)
	d, lower, events := missFillDevice(t, fileBytes, window)
	miss := int64(2 << 20)
	faultAndFill(t, d, events, fileBytes, miss, miss-window/2, miss+window/2, window-pageBytes)
	end := miss + window/2
	for w := int64(2 * window); w <= missRunMaxFactor*window; w *= 2 {
		// The guest ran through the filled pages and faults on the next.
		faultAndFill(t, d, events, fileBytes, end, end+pageBytes, end+w, int(w-pageBytes))
		end += w
	}
	// The window stops growing at its bound.
	last := int64(missRunMaxFactor * window)
	faultAndFill(t, d, events, fileBytes, end, end+pageBytes, end+last, int(last-pageBytes))
	end += last

	filled := d.Counters()
	var run []int64
	for off := miss - window/2; off < end; off += pageBytes {
		run = append(run, off)
	}
	res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes), Pages: run})
	if want := lowerHash(t, lower, run, pageBytes); res.Err != "" || res.Hash != want {
		t.Fatalf("the run: %+v, want hash %s", res, want)
	}
	if got := d.Counters().Sub(filled); got.ReadRequests != 0 {
		t.Fatalf("faults on the filled run sent %d read requests, want 0", got.ReadRequests)
	}

	// A miss far from the run is isolated: the window around it only.
	far := int64(12 << 20)
	faultAndFill(t, d, events, fileBytes, far, far-window/2, far+window/2, window-pageBytes)
	select {
	case e := <-events:
		t.Fatalf("event %+v after the isolated miss's fill, want none", e)
	default:
	}
}

// TestMissFillStoresWhatFollowsTheMissFirst: a guest that ran into a
// page its manifest did not know most likely touches the pages after it
// next, and would fault on each of them again while a fill is still
// storing the pages before the miss. So the fill stores the few pages
// right after the miss first, on their own, then the rest after it, and
// the pages before the miss last.
func TestMissFillStoresWhatFollowsTheMissFirst(t *testing.T) {
	const (
		fileBytes = 8 << 20
		window    = 128 << 10
	)
	d, _, events := missFillDevice(t, fileBytes, window)
	miss := int64(3 << 20)
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes), Pages: []int64{miss}}); res.Err != "" {
		t.Fatalf("child: %s", res.Err)
	}
	if e := waitServed(t, events); e != (served{memdev.Demand, miss, pageBytes}) {
		t.Fatalf("event %+v, want the one-page demand read at %d", e, miss)
	}
	want := []served{
		{memdev.Prefetch, miss + pageBytes, missFillFirstBytes},
		{memdev.Prefetch, miss + pageBytes + missFillFirstBytes, window/2 - pageBytes - missFillFirstBytes},
		{memdev.Prefetch, miss - window/2, window / 2},
	}
	for i, w := range want {
		if e := waitServed(t, events); e != w {
			t.Fatalf("fill %d: %+v, want %+v", i, e, w)
		}
	}
}
