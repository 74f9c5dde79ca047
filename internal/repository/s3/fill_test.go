package s3

import (
	"testing"
	"time"
)

// TestBackgroundFillAfterReady: once a restore of a snapshot is ready, the
// rest of its memory comes into the node cache by itself, unless the fill
// is turned off.
func TestBackgroundFillAfterReady(t *testing.T) {
	pub, rec := chunkyPublisher(t, 21)
	for _, disabled := range []bool{false, true} {
		o := chunkyOptions(t, server.Endpoint, pub.keys.prefix)
		o.Fill = FillOptions{Disabled: disabled, Concurrency: 2, BitsPerSec: 1 << 30}
		node := openWith(t, o)
		res, err := node.Resolve(bg(), rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		res.Memory.(*memorySource).RestoreReady()
		node.WaitFill()
		cached := 0
		for idx := range int64(8) {
			if node.Cache().Cached(rec.MemorySHA256, idx) {
				cached++
			}
		}
		if want := map[bool]int{false: 8, true: 0}[disabled]; cached != want {
			t.Fatalf("fill disabled %v: %d of 8 blocks cached, want %d", disabled, cached, want)
		}
	}
}

// TestFillRequestsAreCountedApart: the request counts say which GETs the
// background fill made, so that what a restore fetched before ready can
// be told from the fill that its ready started (on a loaded node the fill
// fetches before the restore's caller reads the counts).
func TestFillRequestsAreCountedApart(t *testing.T) {
	pub, rec := chunkyPublisher(t, 22)
	o := chunkyOptions(t, server.Endpoint, pub.keys.prefix)
	o.Fill = FillOptions{Concurrency: 2, BitsPerSec: 1 << 30}
	node := openWith(t, o)
	res, rd := resolveMemory(t, node, rec.ID)
	defer rd.Close()
	before := node.RequestStats()
	if _, err := rd.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	demand := node.RequestStats().Sub(before)
	if demand.Gets != 1 || demand.FillGets != 0 || demand.FillGetBytes != 0 {
		t.Fatalf("a demand read counted as %+v, want 1 GET and none of the fill's", demand)
	}
	before = node.RequestStats()
	res.Memory.(*memorySource).RestoreReady()
	node.WaitFill()
	fill := node.RequestStats().Sub(before)
	if fill.Gets == 0 || fill.FillGets != fill.Gets || fill.FillGetBytes != fill.GetBytes || fill.GetBytes == 0 {
		t.Fatalf("the fill counted as %+v, want GETs, every one and every byte of them the fill's", fill)
	}
}

// TestFillHoldsItsRate: the background fill's fetches, however many run at
// once, come in no faster than [backend.s3] background_fill_mbit allows.
func TestFillHoldsItsRate(t *testing.T) {
	const bitsPerSec = 1 << 20 // 128 KiB/s: the 8 blocks take about 1 s
	pub, rec := chunkyPublisher(t, 23)
	o := chunkyOptions(t, server.Endpoint, pub.keys.prefix)
	o.Fill = FillOptions{Concurrency: 4, BitsPerSec: bitsPerSec}
	node := openWith(t, o)
	res, err := node.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res.Memory.(*memorySource).RestoreReady()
	node.WaitFill()
	took := time.Since(start)
	// The meter's bucket holds one block (a tenth of a second's bytes is
	// less): that much passes at once, the rest at the rate.
	paced := int64(8-1) * testChunkBytes
	floor := time.Duration(float64(paced*8) / bitsPerSec * float64(time.Second))
	t.Logf("filled 8 blocks of %d KiB in %v (floor %v)", testChunkBytes>>10, took, floor)
	if took < floor {
		t.Fatalf("the fill took %v for 8 blocks: faster than %d bit/s allows (at least %v)", took, bitsPerSec, floor)
	}
	for idx := range int64(8) {
		if !node.Cache().Cached(rec.MemorySHA256, idx) {
			t.Fatalf("block %d is not cached after the fill", idx)
		}
	}
}
