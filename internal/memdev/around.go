package memdev

import (
	"cmp"
	"slices"

	"warmstart/internal/prefetch"
)

// aroundPageBytes is the granularity of AroundPlan: storage reads whole
// pages, and a guest faults them.
const aroundPageBytes = 4096

// HintPlan is what a plan's storage hint advises, in order: the plan
// itself, then the memory around it (AroundPlan). A guest whose start-up
// drifts from the manifest's touches pages next to the planned ones far
// more often than pages elsewhere; each is a fault, and when the lower is
// cold the read it waits for goes to storage. Advised after the plan, such
// pages are in the lower's page cache by the time the guest faults them,
// while the plan's own reads are queued first. A margin of 0 (or below)
// is the plan alone.
func HintPlan(plan []prefetch.Range, margin, size int64) []prefetch.Range {
	around := AroundPlan(plan, margin, size)
	if len(around) == 0 {
		return plan
	}
	return append(slices.Clip(plan), around...)
}

// AroundPlan is the memory within margin bytes before or after a range of
// plan that no range of plan covers: in file order, widened to whole pages,
// merged where neighbourhoods meet, and within [0, size). A margin of 0
// (or below) is none.
func AroundPlan(plan []prefetch.Range, margin, size int64) []prefetch.Range {
	if margin <= 0 || len(plan) == 0 {
		return nil
	}
	margin = (margin + aroundPageBytes - 1) &^ (aroundPageBytes - 1)
	covered := unionOf(plan, size)
	var out []prefetch.Range
	add := func(lo, hi int64) {
		lo &^= aroundPageBytes - 1
		hi = min(size, (hi+aroundPageBytes-1)&^(aroundPageBytes-1))
		if lo >= hi {
			return
		}
		if n := len(out); n > 0 && lo <= out[n-1].Offset+out[n-1].Length {
			out[n-1].Length = max(out[n-1].Length, hi-out[n-1].Offset)
			return
		}
		out = append(out, prefetch.Range{Offset: lo, Length: hi - lo})
	}
	for i, r := range covered {
		prevEnd, nextStart := int64(0), size
		if i > 0 {
			prevEnd = covered[i-1].Offset + covered[i-1].Length
		}
		if i+1 < len(covered) {
			nextStart = covered[i+1].Offset
		}
		end := r.Offset + r.Length
		add(max(prevEnd, r.Offset-margin), r.Offset)
		add(end, min(nextStart, end+margin))
	}
	return out
}

// unionOf is the memory plan's ranges cover within [0, size), as
// disjoint ranges in file order, touching ones merged.
func unionOf(plan []prefetch.Range, size int64) []prefetch.Range {
	rs := make([]prefetch.Range, 0, len(plan))
	for _, r := range plan {
		lo, hi := max(0, r.Offset), min(size, r.Offset+r.Length)
		if lo < hi {
			rs = append(rs, prefetch.Range{Offset: lo, Length: hi - lo})
		}
	}
	slices.SortFunc(rs, func(a, b prefetch.Range) int { return cmp.Compare(a.Offset, b.Offset) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && r.Offset <= out[n-1].Offset+out[n-1].Length {
			out[n-1].Length = max(out[n-1].Length, r.Offset+r.Length-out[n-1].Offset)
			continue
		}
		out = append(out, r)
	}
	return out
}
