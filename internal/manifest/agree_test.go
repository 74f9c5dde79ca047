package manifest

import (
	"errors"
	"math"
	"slices"
	"testing"
)

// pages is the offsets of the 4 KiB pages numbered ns, in that order.
func pages(ns ...int64) []int64 {
	out := make([]int64, len(ns))
	for i, n := range ns {
		out[i] = n * page
	}
	return out
}

func TestIntersect(t *testing.T) {
	for _, tc := range []struct {
		name        string
		a, b        []int64
		want        []Range
		overlap     float64
		coverA      float64
		coverB      float64
		correlation float64 // NaN: undefined
	}{
		{
			name: "identical runs", a: pages(5, 6, 7, 1, 2), b: pages(5, 6, 7, 1, 2),
			want:    []Range{{5 * page, 3 * page}, {1 * page, 2 * page}},
			overlap: 1, coverA: 1, coverB: 1, correlation: 1,
		},
		{
			// Mean ranks of the common pages: 3 → (1+1)/2, 4 → (2+0)/2
			// (a tie: the first run touched 3 first), 9 → (0+3)/2,
			// 7 → (3+2)/2. Pages 1 and 8 are in one run each: left out.
			// Within the common pages the runs rank 9,3,4,7 and 4,3,7,9:
			// d² = 9, 0, 4, 1.
			name: "drift keeps common pages by mean rank", a: pages(9, 3, 4, 7, 1), b: pages(4, 3, 7, 9, 8),
			want:    []Range{{3 * page, 2 * page}, {9 * page, page}, {7 * page, page}},
			overlap: 4.0 / 6, coverA: 4.0 / 5, coverB: 4.0 / 5, correlation: 1 - 6*(9+0+4+1)/(4*15.0),
		},
		{
			name: "reversed order", a: pages(1, 3, 5, 7), b: pages(7, 5, 3, 1),
			// Every mean rank is 1.5: ties keep the first run's order.
			want:    []Range{{1 * page, page}, {3 * page, page}, {5 * page, page}, {7 * page, page}},
			overlap: 1, coverA: 1, coverB: 1, correlation: -1,
		},
		{
			name: "repeated touches and offsets inside a page count once", a: pages(2, 2, 3), b: []int64{2*page + 100, 3*page + 4095, 3 * page},
			want:    []Range{{2 * page, 2 * page}},
			overlap: 1, coverA: 1, coverB: 1, correlation: 1,
		},
		{
			name: "one page in common has no order to compare", a: pages(1, 2), b: pages(2, 3),
			want:    []Range{{2 * page, page}},
			overlap: 1.0 / 3, coverA: 0.5, coverB: 0.5, correlation: math.NaN(),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, g, err := Intersect(twoRegions, tc.a, tc.b)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(m.Ranges, tc.want) {
				t.Errorf("ranges %v, want %v", m.Ranges, tc.want)
			}
			for _, f := range []struct {
				name      string
				got, want float64
			}{{"overlap", g.Overlap, tc.overlap}, {"cover A", g.CoverA, tc.coverA}, {"cover B", g.CoverB, tc.coverB},
				{"rank correlation", g.RankCorrelation, tc.correlation}} {
				if !(math.Abs(f.got-f.want) < 1e-12 || math.IsNaN(f.got) && math.IsNaN(f.want)) {
					t.Errorf("%s %v, want %v", f.name, f.got, f.want)
				}
			}
			if g.Common*page != int(m.TotalBytes()) {
				t.Errorf("%d common pages, the manifest covers %d bytes", g.Common, m.TotalBytes())
			}
		})
	}
}

func TestIntersectRefusesDisjointRuns(t *testing.T) {
	m, g, err := Intersect(twoRegions, pages(1, 2, 3), pages(4, 5))
	if !errors.Is(err, ErrNoCommonPages) || m != nil {
		t.Fatalf("disjoint runs gave manifest %v, error %v; want ErrNoCommonPages", m, err)
	}
	if g.Overlap != 0 || g.PagesA != 3 || g.PagesB != 2 || g.Common != 0 || !math.IsNaN(g.RankCorrelation) {
		t.Errorf("agreement %+v, want 3 and 2 pages, none common, overlap 0, no correlation", g)
	}
	if _, _, err := Intersect(twoRegions, nil, nil); !errors.Is(err, ErrNoCommonPages) {
		t.Errorf("two empty runs: %v, want ErrNoCommonPages", err)
	}
}

func TestIntersectRoundsToRegionPagesAndRefusesOutsideTouches(t *testing.T) {
	// In the huge-page region a touch anywhere in a 2 MiB page is that page.
	m, g, err := Intersect(twoRegions, []int64{16*mib + 5, 18 * mib}, []int64{18*mib + huge - 1, 16 * mib})
	if err != nil {
		t.Fatal(err)
	}
	if want := []Range{{16 * mib, 2 * huge}}; !slices.Equal(m.Ranges, want) || g.Common != 2 {
		t.Errorf("ranges %v (%d common), want %v", m.Ranges, g.Common, want)
	}
	for _, tc := range []struct {
		name string
		a, b []int64
	}{
		{"first run in the hole", []int64{10 * mib}, pages(1)},
		{"second run past the file", pages(1), []int64{40 * mib}},
		{"negative offset", []int64{-page}, pages(1)},
	} {
		if _, _, err := Intersect(twoRegions, tc.a, tc.b); !errors.Is(err, ErrOutsideLayout) {
			t.Errorf("%s: %v, want ErrOutsideLayout", tc.name, err)
		}
	}
}
