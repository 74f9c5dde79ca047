package fusedev

import (
	"os"
	"sync/atomic"
	"testing"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
)

// TestPassthroughServesMappedReadsWithoutTheDevice: with Passthrough, a
// VMM mapping the device file reads the lower file's bytes through the
// kernel, and no read request reaches the device; a fill is readahead of
// the lower file, reported as prefetch, with nothing read or copied by
// the device.
func TestPassthroughServesMappedReadsWithoutTheDevice(t *testing.T) {
	const fileBytes = 8 << 20
	lower := writeLower(t, fileBytes, 41)
	srv := newServer(t, Options{Passthrough: true})
	events := make(servedEvents, 16)
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Observer = events
	d, err := srv.Attach("pt", req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, d.release()) }()
	f, err := os.Open(d.Path()) // a passthrough open, as a restore's
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := d.Fill(1<<20, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if e := waitServed(t, events); e != (served{memdev.Prefetch, 1 << 20, 1 << 20}) {
		t.Fatalf("fill reported %+v, want 1 MiB prefetched at 1 MiB", e)
	}
	l := layout.Single(fileBytes)
	pages := randomPages(l, 300, 4)
	res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: pages})
	if want := lowerHash(t, lower, pages, pageBytes); res.Err != "" || res.Hash != want {
		t.Fatalf("mapped reads under passthrough: %+v, want hash %s", res, want)
	}
	if got := d.Counters(); got.ReadRequests != 0 || got.BytesRead != 0 {
		t.Fatalf("passthrough: the device served %+v, want nothing", got)
	}
	if !d.Passthrough() {
		t.Fatal("the device does not say it serves in passthrough mode")
	}
}

// TestNoPassthroughByDefault: without the option every fault is the
// device's, checked and counted.
func TestNoPassthroughByDefault(t *testing.T) {
	const fileBytes = 4 << 20
	lower := writeLower(t, fileBytes, 42)
	srv := newServer(t, Options{})
	d := attach(t, srv, "nopt", lower, memdev.IOEngineBuffered)
	defer func() { waitAck(t, d.release()) }()
	l := layout.Single(fileBytes)
	pages := []int64{0, 2 << 20}
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: pages}); res.Err != "" {
		t.Fatalf("child: %s", res.Err)
	}
	if got := d.Counters(); got.ReadRequests == 0 || d.Passthrough() {
		t.Fatalf("default mount: %+v read, passthrough %v; want the device to serve", got, d.Passthrough())
	}
}

// TestPassthroughOnlyForLocalFiles: a lower that is not a local file (a
// remote store's) is served by the device even on a passthrough mount.
func TestPassthroughOnlyForLocalFiles(t *testing.T) {
	const fileBytes = 4 << 20
	path := writeLower(t, fileBytes, 43)
	srv := newServer(t, Options{Passthrough: true})
	open := func() (memdev.Lower, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		return &fileBackedLower{f: f, size: fileBytes, closed: new(atomic.Int32)}, nil
	}
	d, err := srv.Attach("remote", lowerReq("object", open, memdev.IOEngineBuffered))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, d.release()) }()
	l := layout.Single(fileBytes)
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: []int64{pageBytes}}); res.Err != "" {
		t.Fatalf("child: %s", res.Err)
	}
	if got := d.Counters(); got.ReadRequests == 0 || d.Passthrough() {
		t.Fatalf("remote lower on a passthrough mount: %+v read, passthrough %v", got, d.Passthrough())
	}
}
