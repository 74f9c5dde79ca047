package fusedev

import (
	"testing"
	"time"

	"warmstart/internal/durable"
	"warmstart/internal/lab/pagecache"
	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
)

// A prefetching target's storage hint with a margin advises a cold lower
// of the plan's ranges and then of the memory within the margin around
// them, and of nothing farther; without a margin, of the plan alone. The
// hint is run to its end with no fetch, so only the advice brought pages
// into the lower's page cache.
func TestHintMarginBringsTheMemoryAroundThePlanIntoTheLowerPageCache(t *testing.T) {
	const (
		fileBytes = 4 << 20
		margin    = 32 << 10
	)
	plan := []prefetch.Range{{Offset: 3 << 20, Length: 16 << 10}, {Offset: 1 << 20, Length: 8 << 10}}
	for _, m := range []int64{0, margin} {
		lower := writeLower(t, fileBytes, 53)
		if err := durable.Sync(lower); err != nil { // dirty pages cannot be evicted
			t.Fatal(err)
		}
		if err := pagecache.Evict(lower); err != nil {
			t.Fatal(err)
		}
		if r, err := pagecache.Probe(lower); err != nil || !r.None() {
			t.Skipf("the lower file's pages cannot be evicted here (%v, %v)", r, err)
		}
		srv := newServer(t, Options{ReadAheadBytes: pageBytes})
		d := attach(t, srv, "around", lower, memdev.IOEngineBuffered)
		target, release, err := d.Target(plan, memdev.TargetOptions{Fill: true, Hint: true, HintMarginBytes: m})
		if err != nil {
			t.Fatal(err)
		}
		hint := target.(hintingTarget).hint
		hint.Start()
		<-hint.Ended()
		// mincore counts a page once its read has completed: wait for the
		// advised reads, bounded.
		res := waitResident(t, lower, memdev.HintPlan(plan, m, fileBytes))
		release()
		waitAck(t, d.release())
		for _, r := range plan {
			checkResident(t, res, r.Offset, r.Offset+r.Length, true, "the plan")
			around := m > 0
			checkResident(t, res, r.Offset-margin, r.Offset, around, "the margin before")
			checkResident(t, res, r.Offset+r.Length, r.Offset+r.Length+margin, around, "the margin after")
			checkResident(t, res, r.Offset+r.Length+margin, r.Offset+r.Length+2*margin, false, "beyond the margin")
			checkResident(t, res, r.Offset-2*margin, r.Offset-margin, false, "beyond the margin")
		}
	}
}

// waitResident waits until every page of rs is resident in the file at
// path, bounded, and returns the file's residency then.
func waitResident(t *testing.T, path string, rs []prefetch.Range) []bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := pagecache.Pages(path)
		if err != nil {
			t.Fatal(err)
		}
		if allResident(res, rs) {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("the advised ranges %v not resident after 10 s", rs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func allResident(res []bool, rs []prefetch.Range) bool {
	for _, r := range rs {
		for p := r.Offset / pageBytes; p < (r.Offset+r.Length)/pageBytes; p++ {
			if !res[p] {
				return false
			}
		}
	}
	return true
}

func checkResident(t *testing.T, res []bool, lo, hi int64, want bool, what string) {
	t.Helper()
	for p := lo / pageBytes; p < hi/pageBytes; p++ {
		if res[p] != want {
			t.Fatalf("%s: page %d of the lower resident %v, want %v", what, p, res[p], want)
		}
	}
}
