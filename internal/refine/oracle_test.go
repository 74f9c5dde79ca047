package refine

import (
	"slices"
	"time"

	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/startupset"
)

// oldFromEvents is the map-based observation this package built before it
// indexed pages densely: the oracle the current FromEvents must agree with.
func oldFromEvents(plan []manifest.Range, events []startupset.Event, ready time.Duration, touched Touched) Observation {
	obs := Observation{Plan: oldPlanPages(plan)}
	index := make(map[int64]int, len(obs.Plan))
	for i, p := range obs.Plan {
		if _, dup := index[p]; !dup {
			index[p] = i
		}
	}
	reached := make(map[int64]time.Duration, len(obs.Plan))
	// windowed pages were read on demand; demanded ones were needed.
	windowed, demanded := map[int64]bool{}, map[int64]bool{}
	for _, e := range events {
		if !e.ByReady(ready) {
			continue
		}
		if e.Kind != memdev.Demand {
			oldNoteReached(reached, e)
			continue
		}
		for p := e.Offset / PageBytes; p*PageBytes < e.Offset+int64(e.Length); p++ {
			windowed[p] = true
		}
		for _, p := range oldNeededPages(e, touched, index) {
			if demanded[p] {
				continue
			}
			demanded[p] = true
			i, ok := index[p]
			if !ok {
				i = -1
			}
			obs.Demands = append(obs.Demands, Demand{Page: p, At: e.Arrived(), PlanIndex: i})
		}
	}
	slices.SortStableFunc(obs.Demands, func(a, b Demand) int { return cmpDuration(a.At, b.At) })
	obs.Frontier = oldFrontier(obs.Plan, reached)
	obs.Untouched, obs.Used = oldUntouched(obs.Plan, reached, windowed, demanded, touched)
	return obs
}

func oldPlanPages(plan []manifest.Range) []int64 {
	var pages []int64
	for _, r := range plan {
		for p := r.Offset / PageBytes; p*PageBytes < r.End(); p++ {
			pages = append(pages, p)
		}
	}
	return pages
}

func oldNoteReached(reached map[int64]time.Duration, e startupset.Event) {
	for p := e.Offset / PageBytes; p*PageBytes < e.Offset+int64(e.Length); p++ {
		if old, ok := reached[p]; !ok || e.At < old {
			reached[p] = e.At
		}
	}
}

// oldNeededPages are the pages of demand request e the guest needed (see
// FromEvents for the precision).
func oldNeededPages(e startupset.Event, touched Touched, index map[int64]int) []int64 {
	first := e.Offset / PageBytes
	n := (int64(e.Length) + PageBytes - 1) / PageBytes
	if n <= 0 {
		return nil
	}
	middle := first + n/2
	if touched == nil {
		if n == 1 {
			return []int64{first}
		}
		return oldWindowGuess(first, n, middle, index)
	}
	var pages []int64
	for p := first; p < first+n; p++ {
		t, known := touched(p)
		if (known && t) || (!known && p == middle) {
			pages = append(pages, p)
		}
	}
	return pages
}

// oldWindowGuess names the needed pages of a readaround window the device
// cannot see into: the plan pages in it when it holds any (the guest most
// likely faulted one of them, late, and the rest came around it, as the
// accounting counts them), else its middle page.
func oldWindowGuess(first, n, middle int64, index map[int64]int) []int64 {
	var plan []int64
	for p := first; p < first+n; p++ {
		if _, ok := index[p]; ok {
			plan = append(plan, p)
		}
	}
	if len(plan) > 0 {
		return plan
	}
	return []int64{middle}
}

// oldFrontier turns per-page reach times into the prefetch frontier: the
// first plan index not yet reached, as it advanced over time.
func oldFrontier(plan []int64, reached map[int64]time.Duration) []Step {
	type arrival struct {
		at    time.Duration
		index int
	}
	var arrivals []arrival
	for i, p := range plan {
		if at, ok := reached[p]; ok {
			arrivals = append(arrivals, arrival{at, i})
		}
	}
	slices.SortStableFunc(arrivals, func(a, b arrival) int { return cmpDuration(a.at, b.at) })
	in := make([]bool, len(plan))
	var steps []Step
	next := 0
	for _, a := range arrivals {
		in[a.index] = true
		moved := false
		for next < len(plan) && in[next] {
			next++
			moved = true
		}
		if moved {
			steps = append(steps, Step{At: a.at, Index: next})
		}
	}
	return steps
}

// oldUntouched picks, from the plan pages not demanded, those the guest
// certainly did not touch (never in its reach, or known untouched) and
// those it certainly did (known touched). A page read in a demand window
// the device cannot tell about is neither.
func oldUntouched(plan []int64, reached map[int64]time.Duration, windowed, demanded map[int64]bool, touched Touched) (no, yes []int64) {
	for _, p := range plan {
		if demanded[p] {
			continue
		}
		_, in := reached[p]
		if !in && !windowed[p] {
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
