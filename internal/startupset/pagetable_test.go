package startupset

import "testing"

// A table is dense over its pages' span, but pages tens of GiB apart get
// no slot for every page between them, and every page keeps its value.
func TestPageTableIsDenseOnlyWhereThePagesAre(t *testing.T) {
	var near Span
	near.Add(page(10), page(100))
	near.Add(page(4000), PageBytes)
	if tab := NewPageTable[int](near); len(tab.dense) != 4000-10+1 {
		t.Fatalf("pages 10..4000: dense over %d pages, want 3991", len(tab.dense))
	}
	var far Span
	far.Add(page(10), page(100))
	far.Add(64<<30, PageBytes)
	tab := NewPageTable[int](far)
	if len(tab.dense) != 0 {
		t.Fatalf("pages 64 GiB apart: dense over %d pages, want none", len(tab.dense))
	}
	for _, p := range []int64{10, 109, (64 << 30) / PageBytes, -3} {
		*tab.At(p) = int(p) + 1
	}
	for _, p := range []int64{10, 109, (64 << 30) / PageBytes, -3} {
		if got := tab.Get(p); got != int(p)+1 {
			t.Errorf("page %d holds %d, want %d", p, got, p+1)
		}
	}
	if got := tab.Get(11); got != 0 {
		t.Errorf("page never set holds %d", got)
	}
}
