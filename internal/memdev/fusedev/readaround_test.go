package fusedev

import (
	"testing"
	"time"

	"warmstart/internal/durable"
	"warmstart/internal/lab/pagecache"
	"warmstart/internal/layout"
	"warmstart/internal/memdev"
)

// On a mount with a one-page readaround window, a guest's fault reaches
// the device as its one page, and the device asks storage for the lower
// file's bytes around it: the neighbours a guest missing a page tends to
// fault next come in with one storage read, while each of their faults
// still reaches the device page by page.
func TestNarrowWindowReadsAroundTheLowerFile(t *testing.T) {
	const fileBytes = 4 << 20
	lower := writeLower(t, fileBytes, 7)
	srv := newServer(t, Options{ReadAheadBytes: pageBytes})
	d := attach(t, srv, "narrow", lower, memdev.IOEngineBuffered)
	defer func() { waitAck(t, d.release()) }()
	if err := durable.Sync(lower); err != nil { // dirty pages cannot be evicted
		t.Fatal(err)
	}
	if err := pagecache.Evict(lower); err != nil {
		t.Fatal(err)
	}
	if r, err := pagecache.Probe(lower); err != nil || !r.None() {
		t.Skipf("the lower file's pages cannot be evicted here (%v, %v)", r, err)
	}

	fault := int64(2 << 20)
	before := d.Counters()
	res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes), Pages: []int64{fault}})
	if want := lowerHash(t, lower, []int64{fault}, pageBytes); res.Err != "" || res.Hash != want {
		t.Fatalf("fault: %+v, want hash %s", res, want)
	}
	if got := d.Counters().Sub(before); got.ReadRequests != 1 || got.BytesRead != pageBytes {
		t.Fatalf("one fault sent %d requests for %d bytes, want one page", got.ReadRequests, got.BytesRead)
	}
	// The advice starts storage reads that end on their own time: wait
	// for them, bounded.
	around := int64(lowerReadaroundBytes / pageBytes)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := pagecache.Probe(lower)
		if err != nil {
			t.Fatal(err)
		}
		if r.Resident >= around {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lower file after one fault: %v, want the %d pages around it", r, around)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
