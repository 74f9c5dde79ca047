package fusedev

import (
	"os"
	"testing"

	"warmstart/internal/integrity"
	"warmstart/internal/layout"
	"warmstart/internal/memdev"
)

// scatteredMisses faults count pages of d one by one, each far from every
// other miss, so that none continues a run; every fill must be the
// centred window w (the floor: the missFillFirstBytes after the miss).
// It returns the next unused miss offset.
func scatteredMisses(t *testing.T, d *Device, events servedEvents, fileBytes, next int64, count int, w int64) int64 {
	t.Helper()
	for range count {
		lo, hi, want := next-w/2, next+w/2, int(w-pageBytes)
		if w <= missFillFirstBytes {
			lo, hi, want = next+pageBytes, next+pageBytes+missFillFirstBytes, missFillFirstBytes
		}
		faultAndFill(t, d, events, fileBytes, next, lo, hi, want)
		next += 1 << 20
	}
	return next
}

// TestScatteredMissesShrinkTheirWindow: isolated misses whose fills no
// later miss shows in use (none lands just past a fill, continuing a run)
// halve the window around the next one after every missLotsaMiss of them,
// down to the missFillFirstBytes after the miss, the part a fill stores
// first; there it stays. Linux's fault readaround stops after
// MMAP_LOTSAMISS faults its readaround did not prevent, for the same
// reason: a fill nobody touches is copying for nothing.
func TestScatteredMissesShrinkTheirWindow(t *testing.T) {
	const (
		fileBytes = 48 << 20
		window    = 128 << 10
	)
	d, _, events := missFillDevice(t, fileBytes, window)
	next := int64(1 << 20)
	for _, w := range []int64{window, window / 2, window / 4, missFillFirstBytes} {
		next = scatteredMisses(t, d, events, fileBytes, next, missLotsaMiss, w)
	}
	scatteredMisses(t, d, events, fileBytes, next, 2, missFillFirstBytes)
}

// TestARunGrowsTheWindowBack: once scattered misses have shrunk the
// window, a miss just past a fill's end is evidence that the guest ran
// through the filled pages: the window around the next isolated miss
// doubles, as Linux's readaround recovers when its pages get hit.
func TestARunGrowsTheWindowBack(t *testing.T) {
	const (
		fileBytes = 48 << 20
		window    = 128 << 10
	)
	d, _, events := missFillDevice(t, fileBytes, window)
	next := int64(1 << 20)
	for _, w := range []int64{window, window / 2, window / 4} {
		next = scatteredMisses(t, d, events, fileBytes, next, missLotsaMiss, w)
	}
	// At the floor: the fill after this miss is the 16 KiB after it, and
	// the guest faults on the page just past them.
	next = scatteredMisses(t, d, events, fileBytes, next, 1, missFillFirstBytes)
	last := next - 1<<20
	edge := last + pageBytes + missFillFirstBytes
	// The run goes on forward from its edge, with twice its window.
	faultAndFill(t, d, events, fileBytes, edge, edge+pageBytes, edge+2*missFillFirstBytes, 2*missFillFirstBytes-pageBytes)
	scatteredMisses(t, d, events, fileBytes, next, 1, window/4)
}

// TestMissesThatContinueRunsKeepTheWindow: a guest whose misses are
// isolated more often than not, but whose fills are walked through often
// enough that a miss lands just past one before missLotsaMiss isolated
// ones have gone by, keeps the full window around every isolated miss.
func TestMissesThatContinueRunsKeepTheWindow(t *testing.T) {
	const (
		fileBytes = 48 << 20
		window    = 128 << 10
	)
	d, _, events := missFillDevice(t, fileBytes, window)
	next := int64(1 << 20)
	for range 3 {
		next = scatteredMisses(t, d, events, fileBytes, next, missLotsaMiss-1, window)
		last := next - 1<<20
		edge := last + window/2
		faultAndFill(t, d, events, fileBytes, edge, edge+pageBytes, edge+2*window, 2*window-pageBytes)
	}
	scatteredMisses(t, d, events, fileBytes, next, 1, window)
}

// TestAShrunkFillNeverServesACorruptBlock: at the floor, the fill after
// a miss meets a block that fails its digest: the fill's read of the
// pages after the miss fails as a whole, so it stores none of them; the
// guest's read of that block fails, the pages before it read back right
// on demand, and the device reports the block.
func TestAShrunkFillNeverServesACorruptBlock(t *testing.T) {
	const (
		fileBytes = 40 << 20
		window    = 128 << 10
	)
	lower := writeLower(t, fileBytes, 36)
	data, err := os.ReadFile(lower)
	if err != nil {
		t.Fatal(err)
	}
	b := integrity.NewBuilder(integrity.SHA256, fileBytes)
	b.Write(data)
	miss := int64(30 << 20)
	bad := miss + 3*pageBytes // the third page after the miss
	f, err := os.OpenFile(lower, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{^data[bad+7]}, bad+7); err != nil {
		t.Fatal(err)
	}
	f.Close()

	srv := missFillServer(t, window)
	events := make(servedEvents, 1024)
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Observer = events
	req.Verifier = &memdev.Verifier{Table: b.Table()}
	d, err := srv.Attach("bad", req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, d.release()) }()
	held, err := os.Open(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	next := int64(1 << 20)
	for _, w := range []int64{window, window / 2, window / 4} {
		next = scatteredMisses(t, d, events, fileBytes, next, missLotsaMiss, w)
	}
	faultAndFill(t, d, events, fileBytes, miss, miss+pageBytes, miss+pageBytes+missFillFirstBytes, 0)

	l := layout.Single(fileBytes)
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: []int64{bad}}); res.Err == "" {
		t.Fatalf("a read of the corrupt block succeeded (hash %s)", res.Hash)
	}
	good := []int64{miss + pageBytes, miss + 2*pageBytes}
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: l, Pages: good}); res.Err != "" || res.Hash != lowerHash(t, lower, good, pageBytes) {
		t.Fatalf("pages before the corrupt block: %+v", res)
	}
	if d.Corruption() == nil {
		t.Fatal("the device reports no corrupt block")
	}
}
