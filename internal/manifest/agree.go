package manifest

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"

	"warmstart/internal/layout"
)

// ErrNoCommonPages reports two recordings that share no page: there is no
// startup set both agree on, and an empty manifest would prefetch nothing.
var ErrNoCommonPages = errors.New("the recordings touched no page in common")

// Agreement is how much two recordings of one snapshot's start-up agree.
type Agreement struct {
	// PagesA and PagesB are the distinct pages each recording touched;
	// Common those both touched.
	PagesA, PagesB, Common int
	// Overlap is Common / |A ∪ B| (Jaccard); CoverA and CoverB are Common
	// over PagesA and PagesB: how much of each run the other repeated.
	Overlap, CoverA, CoverB float64
	// RankCorrelation is Spearman's rho of the two first-touch orders over
	// the common pages: 1 for the same order, -1 for the reverse. NaN when
	// fewer than two pages are common (no order to compare).
	RankCorrelation float64
}

// Intersect builds the manifest of the pages both recordings touched,
// ranked by their mean first-touch rank (rank: the page's position among
// the distinct pages of its recording, in touch order), and reports how
// much the recordings agree. Offsets are rounded down to their region's
// page as in Build. A page only one recording touched is left out: the
// guest's start-up does not need it every time, and prefetching it would
// cost a read every restore. With no page in common it returns the
// agreement and ErrNoCommonPages.
func Intersect(l layout.Layout, a, b []int64) (*Manifest, Agreement, error) {
	ra, err := pageRanks(l, a)
	if err != nil {
		return nil, Agreement{}, fmt.Errorf("first recording: %w", err)
	}
	rb, err := pageRanks(l, b)
	if err != nil {
		return nil, Agreement{}, fmt.Errorf("second recording: %w", err)
	}
	common := commonByMeanRank(ra, rb)
	agr := agreement(ra, rb, common)
	if len(common) == 0 {
		return nil, agr, ErrNoCommonPages
	}
	m, err := Build(l, common)
	if err != nil {
		return nil, agr, err
	}
	return m, agr, nil
}

// pageRanks maps every distinct page of offsets to its first-touch rank.
func pageRanks(l layout.Layout, offsets []int64) (map[int64]int, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	ranks := make(map[int64]int, len(offsets))
	for i, off := range offsets {
		ri, ok := l.RegionAt(off)
		if !ok || off < 0 {
			return nil, fmt.Errorf("%w: touch %d at offset %d is in no region of layout %s", ErrOutsideLayout, i, off, l)
		}
		page := off - off%l.Regions[ri].PageSize
		if _, seen := ranks[page]; !seen {
			ranks[page] = len(ranks)
		}
	}
	return ranks, nil
}

// commonByMeanRank lists the pages of both rank maps by mean rank; ties go
// to the page the first recording touched earlier, so the order is total
// and the result deterministic.
func commonByMeanRank(ra, rb map[int64]int) []int64 {
	var common []int64
	for p := range ra {
		if _, ok := rb[p]; ok {
			common = append(common, p)
		}
	}
	slices.SortFunc(common, func(x, y int64) int {
		// Sums instead of means: the same order without fractions.
		if c := cmp.Compare(ra[x]+rb[x], ra[y]+rb[y]); c != 0 {
			return c
		}
		return cmp.Compare(ra[x], ra[y])
	})
	return common
}

func agreement(ra, rb map[int64]int, common []int64) Agreement {
	n := len(common)
	g := Agreement{PagesA: len(ra), PagesB: len(rb), Common: n, RankCorrelation: spearman(ra, rb, common)}
	if union := len(ra) + len(rb) - n; union > 0 {
		g.Overlap = float64(n) / float64(union)
	}
	if len(ra) > 0 {
		g.CoverA = float64(n) / float64(len(ra))
	}
	if len(rb) > 0 {
		g.CoverB = float64(n) / float64(len(rb))
	}
	return g
}

// spearman is rho over the common pages, each ranked again within the
// common set in each recording's order (no ties: ranks are positions), so
// rho = 1 - 6 Σd² / (n (n² - 1)).
func spearman(ra, rb map[int64]int, common []int64) float64 {
	n := len(common)
	if n < 2 {
		return math.NaN()
	}
	within := func(r map[int64]int) map[int64]int {
		pages := slices.Clone(common)
		slices.SortFunc(pages, func(x, y int64) int { return cmp.Compare(r[x], r[y]) })
		pos := make(map[int64]int, n)
		for i, p := range pages {
			pos[p] = i
		}
		return pos
	}
	pa, pb := within(ra), within(rb)
	var sum float64
	for _, p := range common {
		d := float64(pa[p] - pb[p])
		sum += d * d
	}
	fn := float64(n)
	return 1 - 6*sum/(fn*(fn*fn-1))
}
