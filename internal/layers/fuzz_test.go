package layers

import (
	"bytes"
	"testing"
)

// FuzzDecodePageMap: any input either fails with ErrBadPageMap or decodes
// to a valid map whose encoding is the input and over which a chain
// builds.
func FuzzDecodePageMap(f *testing.F) {
	f.Add((&PageMap{MemorySize: 64 * PageBytes, Data: []Run{{0, 3}, {9, 2}}, Zero: []Run{{4, 1}}}).Encode())
	f.Add((&PageMap{MemorySize: PageBytes}).Encode())
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodePageMap(data)
		if err != nil {
			return
		}
		if !bytes.Equal(m.Encode(), data) {
			t.Fatalf("decoded map encodes to other bytes")
		}
		if m.MemorySize <= 1<<24 {
			if _, err := NewChain(m.MemorySize, []*PageMap{nil, m}); err != nil {
				t.Fatalf("valid map refused by NewChain: %v", err)
			}
		}
	})
}
