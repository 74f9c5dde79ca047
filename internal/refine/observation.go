package refine

import (
	"slices"
	"time"

	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/startupset"
)

// Touched says whether the guest touched a page that was brought into its
// reach (prefetched or resident), when the device can tell (known). A nil
// Touched means the device cannot tell for any page.
type Touched func(page int64) (touched, known bool)

// Demand is one page the guest needed on demand by ready.
type Demand struct {
	Page int64
	// At is when the request arrived, from the start of the restore.
	At time.Duration
	// PlanIndex is the page's position in the plan; -1 when the page was
	// outside it (missed).
	PlanIndex int
}

// Step is a point of the prefetch frontier: from At on, every plan page
// before Index was in the guest's reach.
type Step struct {
	At    time.Duration
	Index int
}

// Observation is what one restore with prefetch saw of its plan, at ready.
type Observation struct {
	// Plan is the plan's pages in prefetch order (the manifest's order).
	Plan []int64
	// Demands are the pages the guest needed on demand by ready, each
	// once (its first request), in arrival order: late pages (in the plan)
	// and missed ones.
	Demands []Demand
	// Frontier is how far prefetch had come over time, ascending.
	Frontier []Step
	// Untouched are plan pages the restore showed the guest did not touch
	// by ready: neither brought in nor requested, or brought in and known
	// untouched.
	Untouched []int64
	// Used are plan pages brought in and known touched.
	Used []int64
}

// Counts returns how many demands were late (in the plan) and missed.
func (o Observation) Counts() (late, missed int) {
	for _, d := range o.Demands {
		if d.PlanIndex < 0 {
			missed++
		} else {
			late++
		}
	}
	return late, missed
}

// FromEvents builds the observation of one restore from what its memory
// device served until ready. plan is the manifest the restore prefetched.
//
// A demand request is a touch on the uffd device (one page per fault). On
// the file device it is the kernel's readaround window around the fault
// (128 KiB by default), so the window's pages are not all needed: with
// touched, only the pages it says were touched count; without it, a window
// holding plan pages counts those (the guest most likely faulted one of
// them, late, and the rest came around it, as the accounting counts them),
// and any other window one page: its middle page, which is the faulting
// page of a synchronous mmap readaround (the kernel centres the window on
// the fault). A window cut short (at the start of the file, or by pages
// already cached) or an asynchronous readahead then names a neighbour:
// such a page is learned as needed, and later restores keep it while the
// device cannot say it went untouched.
func FromEvents(plan []manifest.Range, events []startupset.Event, ready time.Duration, touched Touched) Observation {
	obs := Observation{Plan: planPages(plan)}
	sn := newSeen(plan, events, ready)
	pages := sn.pages
	var needed []int64 // reused for every demand request
	for i, p := range obs.Plan {
		if ps := pages.At(p); ps.plan == 0 {
			ps.plan = int32(i + 1)
		}
	}
	for i, e := range events {
		if !e.ByReady(ready) {
			continue
		}
		if e.Kind != memdev.Demand {
			sn.noteReached(i)
			continue
		}
		for p := e.Offset / PageBytes; p*PageBytes < e.Offset+int64(e.Length); p++ {
			pages.At(p).flags |= wasWindowed
		}
		needed = neededPages(needed[:0], e, touched, pages)
		for _, p := range needed {
			ps := pages.At(p)
			if ps.flags&wasDemanded != 0 {
				continue
			}
			ps.flags |= wasDemanded
			obs.Demands = append(obs.Demands, Demand{Page: p, At: e.Arrived(), PlanIndex: int(ps.plan) - 1})
		}
	}
	slices.SortStableFunc(obs.Demands, func(a, b Demand) int { return cmpDuration(a.At, b.At) })
	obs.Frontier = sn.frontier(obs.Plan)
	obs.Untouched, obs.Used = untouched(obs.Plan, pages, touched)
	return obs
}

// pageState is what a restore showed of one page by ready: its first
// position in the plan and the event that first brought it into the
// guest's reach, each plus one (0: none), and whether it was read in a
// demand window or needed on demand. Positions, not times, keep the table
// at 12 bytes a page: it is allocated and zeroed once per restore. An
// int32 holds them: a plan of 2^31 pages would be 8 TiB of memory, and a
// restore's events, kept in memory, number far fewer.
type pageState struct {
	plan, reached int32
	flags         uint8
}

const (
	wasWindowed uint8 = 1 << iota
	wasDemanded
)

// seen is what the events by ready showed of every page they or the plan
// name.
type seen struct {
	events []startupset.Event
	pages  *startupset.PageTable[pageState]
}

// reachedAt is when the page first came into the guest's reach; valid
// where ps.reached is not 0.
func (sn *seen) reachedAt(ps pageState) time.Duration { return sn.events[ps.reached-1].At }

// newSeen makes the table of the pages the plan and the events by ready
// name.
func newSeen(plan []manifest.Range, events []startupset.Event, ready time.Duration) *seen {
	var s startupset.Span
	for _, r := range plan {
		s.Add(r.Offset, r.Length)
	}
	for _, e := range events {
		if e.ByReady(ready) {
			s.Add(e.Offset, int64(e.Length))
		}
	}
	return &seen{events: events, pages: startupset.NewPageTable[pageState](s)}
}

func planPages(plan []manifest.Range) []int64 {
	var s startupset.Span
	for _, r := range plan {
		s.Add(r.Offset, r.Length)
	}
	var pages []int64
	if s.Pages() > 0 {
		pages = make([]int64, 0, s.Pages())
	}
	for _, r := range plan {
		for p := r.Offset / PageBytes; p*PageBytes < r.End(); p++ {
			pages = append(pages, p)
		}
	}
	return pages
}

// noteReached takes event i, which brought pages into reach.
func (sn *seen) noteReached(i int) {
	e := sn.events[i]
	for p := e.Offset / PageBytes; p*PageBytes < e.Offset+int64(e.Length); p++ {
		if ps := sn.pages.At(p); ps.reached == 0 || e.At < sn.reachedAt(*ps) {
			ps.reached = int32(i + 1)
		}
	}
}

// neededPages appends to needed the pages of demand request e the guest
// needed (see FromEvents for the precision).
func neededPages(needed []int64, e startupset.Event, touched Touched, pages *startupset.PageTable[pageState]) []int64 {
	first := e.Offset / PageBytes
	n := (int64(e.Length) + PageBytes - 1) / PageBytes
	if n <= 0 {
		return needed
	}
	middle := first + n/2
	if touched == nil {
		if n == 1 {
			return append(needed, first)
		}
		return windowGuess(needed, first, n, middle, pages)
	}
	for p := first; p < first+n; p++ {
		t, known := touched(p)
		if (known && t) || (!known && p == middle) {
			needed = append(needed, p)
		}
	}
	return needed
}

// windowGuess appends the needed pages of a readaround window the device
// cannot see into: the plan pages in it when it holds any (the guest most
// likely faulted one of them, late, and the rest came around it, as the
// accounting counts them), else its middle page.
func windowGuess(needed []int64, first, n, middle int64, pages *startupset.PageTable[pageState]) []int64 {
	before := len(needed)
	for p := first; p < first+n; p++ {
		if pages.Get(p).plan != 0 {
			needed = append(needed, p)
		}
	}
	if len(needed) > before {
		return needed
	}
	return append(needed, middle)
}

// frontier turns per-page reach times into the prefetch frontier: the
// first plan index not yet reached, as it advanced over time (reaches at
// the same time taken in plan order). The frontier moves when the plan
// page it stands on is reached, at that page's time t, and then stops at
// the next page reached no earlier than t (or never): one pass over the
// plan, no sort.
func (sn *seen) frontier(plan []int64) []Step {
	n := sn.eachStep(plan, func(Step) {})
	if n == 0 {
		return nil
	}
	steps := make([]Step, 0, n)
	sn.eachStep(plan, func(s Step) { steps = append(steps, s) })
	return steps
}

// eachStep calls step with every step of the frontier, in order, and
// says how many there were: counted first, the steps fill one allocation.
func (sn *seen) eachStep(plan []int64, step func(Step)) int {
	n := 0
	for j := 0; j < len(plan); n++ {
		ps := sn.pages.Get(plan[j])
		if ps.reached == 0 {
			break
		}
		at := sn.reachedAt(ps)
		k := j + 1
		for ; k < len(plan); k++ {
			if next := sn.pages.Get(plan[k]); next.reached == 0 || sn.reachedAt(next) >= at {
				break
			}
		}
		step(Step{At: at, Index: k})
		j = k
	}
	return n
}

// untouched picks, from the plan pages not demanded, those the guest
// certainly did not touch (never in its reach, or known untouched) and
// those it certainly did (known touched). A page read in a demand window
// the device cannot tell about is neither.
func untouched(plan []int64, pages *startupset.PageTable[pageState], touched Touched) (no, yes []int64) {
	for _, p := range plan {
		ps := pages.Get(p)
		if ps.flags&wasDemanded != 0 {
			continue
		}
		if ps.reached == 0 && ps.flags&wasWindowed == 0 {
			no = append(no, p)
			continue
		}
		if touched == nil {
			continue
		}
		switch t, known := touched(p); {
		case known && t:
			yes = append(yes, p)
		case known:
			no = append(no, p)
		}
	}
	return no, yes
}

// frontierAt is the frontier index at time t.
func (o Observation) frontierAt(t time.Duration) int {
	i, _ := slices.BinarySearchFunc(o.Frontier, t, func(s Step, t time.Duration) int {
		if s.At <= t {
			return -1
		}
		return 1
	})
	if i == 0 {
		return 0
	}
	return o.Frontier[i-1].Index
}

func cmpDuration(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
