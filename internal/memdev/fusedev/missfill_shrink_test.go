package fusedev

import (
	"testing"
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
