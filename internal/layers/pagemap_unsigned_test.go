package layers

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// TestPageMapRefusesFieldsBeyondInt64: a run's stored first page or count
// is unsigned; one at or above 2^63, or one reaching past the memory, is
// refused with an error naming the run's field and its stored value, not
// a negative number it wrapped to.
func TestPageMapRefusesFieldsBeyondInt64(t *testing.T) {
	good := (&PageMap{MemorySize: 8 * PageBytes, Data: []Run{{0, 1}}, Zero: []Run{{2, 1}}}).Encode()
	const dataRun, zeroRun = pageMapHeader, pageMapHeader + runBytes
	for name, c := range map[string]struct {
		at   int
		v    uint64
		want string
	}{
		"data first 2^63":     {dataRun, 1 << 63, "data run 0: first page 9223372036854775808"},
		"data count max":      {dataRun + 8, ^uint64(0), "data run 0: count 18446744073709551615"},
		"zero first max":      {zeroRun, ^uint64(0), "zero run 0: first page 18446744073709551615"},
		"zero count 2^63":     {zeroRun + 8, 1 << 63, "zero run 0: count 9223372036854775808"},
		"zero past memory":    {zeroRun + 8, 7, "zero run 0: count 7"},
		"first past memory":   {zeroRun, 9, "zero run 0: first page 9"},
		"count wraps the sum": {zeroRun + 8, 1<<64 - 1, "count 18446744073709551615"},
	} {
		t.Run(name, func(t *testing.T) {
			b := append([]byte(nil), good...)
			binary.LittleEndian.PutUint64(b[c.at:], c.v)
			_, err := DecodePageMap(b)
			if !errors.Is(err, ErrBadPageMap) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("decode = %v, want ErrBadPageMap naming %q", err, c.want)
			}
			if strings.Contains(err.Error(), "-") {
				t.Fatalf("decode = %v: a stored unsigned field reported as negative", err)
			}
		})
	}
}
