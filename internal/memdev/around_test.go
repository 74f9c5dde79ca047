package memdev

import (
	"reflect"
	"testing"

	"warmstart/internal/prefetch"
)

func rg(off, n int64) prefetch.Range { return prefetch.Range{Offset: off, Length: n} }

// The memory around a plan is the margin before and after each of its
// ranges that no range covers: in file order whatever the plan's order,
// merged where two neighbourhoods meet, widened to whole pages, and never
// before 0 nor past the memory's size.
func TestAroundPlanCoversTheMarginClippedAndMerged(t *testing.T) {
	const p = 4096
	plan := []prefetch.Range{
		rg(100*p, 2*p), // first touched, far up in memory
		rg(1*p, p),     // its margin before is clipped at 0
		rg(10*p, p),    // 10 and 14 have margins that meet: one range between
		rg(14*p, 2*p),
		rg(15*p, 3*p), // overlaps the one before: one covered run, 14–18
		rg(254*p, p),  // near the end: clipped at size
	}
	got := AroundPlan(plan, 2*p+1, 256*p) // a margin that is not whole pages rounds up to 3
	want := []prefetch.Range{
		rg(0, p), rg(2*p, 3*p), // before 1 (clipped), after 1 (3 pages)
		rg(7*p, 3*p), rg(11*p, 3*p), // before 10; after 10 and before 14, merged, never over 14
		rg(18*p, 3*p),
		rg(97*p, 3*p), rg(102*p, 3*p),
		rg(251*p, 3*p), rg(255*p, p), // after 254: clipped at the size
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("AroundPlan:\n got %v\nwant %v", got, want)
	}
}

// A margin of 0 is today's hint: the plan, nothing around it.
func TestHintPlanWithoutAMarginIsThePlan(t *testing.T) {
	plan := []prefetch.Range{rg(8192, 4096), rg(0, 4096)}
	if got := HintPlan(plan, 0, 1<<20); !reflect.DeepEqual(got, plan) {
		t.Fatalf("HintPlan with margin 0 = %v, want the plan %v", got, plan)
	}
	if got := AroundPlan(nil, 4096, 1<<20); got != nil {
		t.Fatalf("AroundPlan of an empty plan = %v, want none", got)
	}
}

// With a margin, the plan comes first and unchanged, in its own order
// (first touch), and the memory around it after: the plan's reads are
// queued with storage before any of its neighbourhood's. The caller's plan
// is not written to.
func TestHintPlanAdvisesThePlanFirstThenAroundIt(t *testing.T) {
	plan := []prefetch.Range{rg(64<<10, 4096), rg(0, 4096)}
	orig := append([]prefetch.Range(nil), plan...)
	got := HintPlan(plan[:2:2], 8192, 1<<20)
	want := append(append([]prefetch.Range(nil), orig...),
		rg(4096, 8192), rg(56<<10, 8192), rg(68<<10, 8192))
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("HintPlan:\n got %v\nwant %v", got, want)
	}
	if !reflect.DeepEqual(plan, orig) {
		t.Fatalf("HintPlan changed the plan to %v", plan)
	}
}

// A plan whose ranges cover the whole memory has nothing around it, and
// ranges reaching past the size (a manifest for a larger memory) are
// clipped, never advised beyond it.
func TestAroundPlanNeverReachesPastTheMemory(t *testing.T) {
	if got := AroundPlan([]prefetch.Range{rg(0, 1<<20)}, 64<<10, 1<<20); got != nil {
		t.Fatalf("around the whole memory: %v, want none", got)
	}
	got := AroundPlan([]prefetch.Range{rg(1<<20-4096, 64<<10)}, 64<<10, 1<<20)
	want := []prefetch.Range{rg(1<<20-4096-64<<10, 64<<10)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("around a range past the size: %v, want %v", got, want)
	}
}
