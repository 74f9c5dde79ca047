package pause_test

import (
	"slices"
	"testing"

	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/pause"
)

func harvestLayout(t *testing.T) layout.Layout {
	t.Helper()
	l := layout.Layout{FileSize: 64 << 12, Regions: []layout.Region{{Offset: 0, Size: 64 << 12, PageSize: 4096}}}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	return l
}

func pagesOf(m *manifest.Manifest) []int64 {
	var pages []int64
	for _, r := range m.Ranges {
		for off := r.Offset; off < r.End(); off += 4096 {
			pages = append(pages, off/4096)
		}
	}
	return pages
}

// TestHarvestRanksStartupThenWrittenWithinTheCut: the startup path comes
// first in its order, each page once; written pages follow up to the cut;
// without a startup path every written page is kept.
func TestHarvestRanksStartupThenWrittenWithinTheCut(t *testing.T) {
	l := harvestLayout(t)
	cases := []struct {
		name             string
		startup, written []int64
		extra            int
		want             []int64
	}{
		{"startup order kept, duplicates dropped", []int64{9, 3, 9, 4, 5, 6, 7, 8}, nil, 25, []int64{9, 3, 4, 5, 6, 7, 8}},
		{"written cut at a quarter of the startup path", []int64{1, 2, 3, 4, 5, 6, 7, 8}, []int64{2, 20, 21, 22, 23}, 25, []int64{1, 2, 3, 4, 5, 6, 7, 8, 20, 21}},
		{"all written without a startup path", nil, []int64{30, 31, 40}, 25, []int64{30, 31, 40}},
		{"no cut at 100 %", []int64{1, 2}, []int64{10, 11, 12}, 100, []int64{1, 2, 10, 11}},
	}
	for _, tc := range cases {
		m, h, err := pause.Harvest(pause.HarvestInput{Layout: l, Startup: tc.startup, Written: tc.written, ExtraPercent: tc.extra})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := pagesOf(m); !slices.Equal(got, tc.want) {
			t.Errorf("%s: pages %v, want %v", tc.name, got, tc.want)
		}
		if h.StartupPages+h.WrittenPages != int64(len(tc.want)) {
			t.Errorf("%s: counted %d startup + %d written pages, want %d in all", tc.name, h.StartupPages, h.WrittenPages, len(tc.want))
		}
	}
	if _, _, err := pause.Harvest(pause.HarvestInput{Layout: l, Startup: []int64{64}}); err == nil {
		t.Error("a page outside the layout was harvested")
	}
}
