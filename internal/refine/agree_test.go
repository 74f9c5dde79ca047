package refine

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/startupset"
)

// randomOffset is a byte offset mostly within a few hundred pages, now and
// then unaligned, negative or tens of GiB away (a sparse large guest).
func randomOffset(rng *rand.Rand) int64 {
	off := rng.Int64N(260) * PageBytes
	switch rng.IntN(20) {
	case 0:
		off += rng.Int64N(PageBytes)
	case 1:
		off = -off
	case 2:
		off += 64 << 30
	}
	return off
}

// randomLength is 0 to a few pages, sometimes a 128 KiB window, sometimes
// not a multiple of the page.
func randomLength(rng *rand.Rand) int64 {
	switch rng.IntN(10) {
	case 0:
		return 0
	case 1:
		return 32 * PageBytes
	case 2:
		return rng.Int64N(3*PageBytes) + 1
	}
	return (rng.Int64N(8) + 1) * PageBytes
}

// randomTouched is nil (the device cannot tell) or a fixed random answer
// per page, unknown for some.
func randomTouched(rng *rand.Rand) Touched {
	if rng.IntN(2) == 0 {
		return nil
	}
	seed := rng.Uint64()
	return func(p int64) (bool, bool) {
		h := (uint64(p) ^ seed) * 0x9e3779b97f4a7c15 >> 60
		return h&1 == 0, h&6 != 0
	}
}

// randomRestore is a plan with overlapping and duplicate ranges, and
// events past the plan, zero-length ones and ones after ready.
func randomRestore(rng *rand.Rand) ([]manifest.Range, []startupset.Event, time.Duration) {
	var plan []manifest.Range
	for range rng.IntN(40) {
		plan = append(plan, manifest.Range{Offset: randomOffset(rng), Length: randomLength(rng)})
	}
	var events []startupset.Event
	for range rng.IntN(80) {
		took := time.Duration(rng.Int64N(6)) * ms / 2 // coarse: ties happen
		events = append(events, startupset.Event{Kind: memdev.Kind(rng.IntN(4)), Offset: randomOffset(rng),
			Length: int(randomLength(rng)), At: time.Duration(rng.Int64N(40)) * ms / 2, Took: took})
	}
	return plan, events, time.Duration(rng.Int64N(40)) * ms / 2
}

// The observation agrees with the map-based one it replaced on thousands
// of random restores, with and without a device that tells touches.
func TestFromEventsAgreesWithTheMapBasedOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for i := range 5000 {
		plan, events, ready := randomRestore(rng)
		touched := randomTouched(rng)
		got, want := FromEvents(plan, events, ready, touched), oldFromEvents(plan, events, ready, touched)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("restore %d (plan %v, events %+v, ready %v):\n got %+v\nwant %+v", i, plan, events, ready, got, want)
		}
	}
}
