package startupset

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"warmstart/internal/memdev"
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

// randomInput is a restore's input with overlapping and duplicate ranges,
// events past the set, zero-length events and events after ready.
func randomInput(rng *rand.Rand) Input {
	var in Input
	for range rng.IntN(40) {
		in.StartupSet = append(in.StartupSet, Range{Offset: randomOffset(rng), Length: randomLength(rng)})
	}
	for range rng.IntN(80) {
		took := time.Duration(rng.Int64N(6)) * ms / 2 // coarse: ties happen
		in.Events = append(in.Events, Event{Kind: memdev.Kind(rng.IntN(4)), Offset: randomOffset(rng),
			Length: int(randomLength(rng)), At: time.Duration(rng.Int64N(40)) * ms / 2, Took: took})
	}
	in.Ready = time.Duration(rng.Int64N(40)) * ms / 2
	in.PrefetchRan = rng.IntN(2) == 0
	if rng.IntN(2) == 0 {
		in.PrefetchEnded = time.Duration(rng.Int64N(int64(20 * ms)))
	}
	return in
}

// The accounting agrees with the map-based one it replaced on thousands
// of random restores.
func TestAccountAgreesWithTheMapBasedOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for i := range 5000 {
		in := randomInput(rng)
		if got, want := Account(in), oldAccount(in); !reflect.DeepEqual(got, want) {
			t.Fatalf("input %d %+v:\n got %+v\nwant %+v", i, in, got, want)
		}
	}
}
