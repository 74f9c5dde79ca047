package chunkmap

import (
	"encoding/binary"
	"math"
	"testing"
)

// TestPackRangeAtTheInt64Edge: a stored range ending on the last page
// boundary below 2^63 is valid and decodes as stored; one page further
// (its end past 2^63-1) is refused.
func TestPackRangeAtTheInt64Edge(t *testing.T) {
	const length = 4096
	lastStart := uint64(math.MaxInt64) &^ 4095 // the last page-aligned offset
	e := make([]byte, packRangeBytes)
	binary.LittleEndian.PutUint64(e, lastStart-length)
	binary.LittleEndian.PutUint64(e[8:], length)
	r, err := decodePackRange(e, 1<<20)
	if err != nil || uint64(r.Offset) != lastStart-length || r.Length != length {
		t.Fatalf("range ending at %d: %+v, %v; want it decoded as stored", lastStart, r, err)
	}
	binary.LittleEndian.PutUint64(e, lastStart)
	if r, err := decodePackRange(e, 1<<20); err == nil {
		t.Fatalf("range ending past 2^63-1 decoded as %+v", r)
	}
}
