package fusedev

import (
	"errors"
	"os"
	"testing"

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
