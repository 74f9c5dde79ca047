package layers

import (
	"reflect"
	"testing"
)

// TestPageMapDecodesRunsAtTheMemorysEdge: the bounds a decoder checks a
// stored run against admit every valid one: a run ending on the memory's
// last page, one starting on it, and runs covering every page.
func TestPageMapDecodesRunsAtTheMemorysEdge(t *testing.T) {
	for name, m := range map[string]*PageMap{
		"data to the last page":   {MemorySize: 8 * PageBytes, Data: []Run{{6, 2}}, Zero: []Run{{0, 6}}},
		"zero on the last page":   {MemorySize: 8 * PageBytes, Data: []Run{{0, 1}}, Zero: []Run{{7, 1}}},
		"one run of every page":   {MemorySize: 8 * PageBytes, Data: []Run{{0, 8}}},
		"a one-page memory":       {MemorySize: PageBytes, Zero: []Run{{0, 1}}},
		"the largest memory, end": {MemorySize: maxMemorySize, Data: []Run{{maxMemorySize/PageBytes - 1, 1}}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := DecodePageMap(m.Encode())
			if err != nil {
				t.Fatalf("decode of a valid map: %v", err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("decode = %+v, want %+v", got, m)
			}
		})
	}
}
