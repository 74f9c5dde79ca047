package refine

import (
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/startupset"
)

// readyRestore is one realistic restore at ready: 128 MiB of guest memory,
// a plan of ~2,300 ranges covering ~12k pages in first-touch order,
// ~2,400 prefetch events of ~20 KiB walking it, and ~300 demand faults,
// some late, some missed, some after ready.
type readyRestore struct {
	plan   []manifest.Range
	events []startupset.Event
	ready  time.Duration
}

func newReadyRestore() readyRestore {
	const memPages = (128 << 20) / PageBytes
	rng := rand.New(rand.NewPCG(1, 2))
	used := make([]bool, memPages)
	var r readyRestore
	for len(r.plan) < 2300 {
		first, n := rng.Int64N(memPages-10), rng.Int64N(9)+1
		if used[first] || used[first+n-1] {
			continue
		}
		for p := first; p < first+n; p++ {
			used[p] = true
		}
		r.plan = append(r.plan, manifest.Range{Offset: first * PageBytes, Length: n * PageBytes})
	}
	r.ready = 400 * time.Millisecond
	r.events = prefetchWalk(r.plan, 500*time.Millisecond)
	for i := range 300 {
		page := rng.Int64N(memPages)
		at := time.Duration(rng.Int64N(int64(r.ready + r.ready/8)))
		if i%2 == 0 { // a late page of the plan
			pr := r.plan[rng.IntN(len(r.plan))]
			page = pr.Offset / PageBytes
		}
		r.events = append(r.events, startupset.Event{Kind: memdev.Demand, Offset: page * PageBytes,
			Length: PageBytes, At: at, Took: 50 * time.Microsecond})
	}
	return r
}

// prefetchWalk brings the plan in, in order, 20 KiB at a time, evenly
// over took.
func prefetchWalk(plan []manifest.Range, took time.Duration) []startupset.Event {
	var events []startupset.Event
	for _, pr := range plan {
		for off := pr.Offset; off < pr.End(); off += 5 * PageBytes {
			n := min(5*PageBytes, pr.End()-off)
			events = append(events, startupset.Event{Kind: memdev.Prefetch, Offset: off, Length: int(n)})
		}
	}
	for i := range events {
		events[i].At = took * time.Duration(i+1) / time.Duration(len(events))
		events[i].Took = 100 * time.Microsecond
	}
	return events
}

// BenchmarkAccountAtReady is what a restore computes at ready: the
// startup-set accounting and the observation for the plan's refinement.
func BenchmarkAccountAtReady(b *testing.B) {
	r := newReadyRestore()
	set := make([]startupset.Range, len(r.plan))
	pages := 0
	for i, pr := range r.plan {
		set[i] = startupset.Range{Offset: pr.Offset, Length: pr.Length}
		pages += int(pr.Length / PageBytes)
	}
	b.Logf("plan %d ranges, %d pages; %d events", len(r.plan), pages, len(r.events))
	in := startupset.Input{StartupSet: set, Events: r.events, Ready: r.ready, PrefetchRan: true}
	cpu0 := processCPU(b)
	for b.Loop() {
		startupset.Account(in)
		FromEvents(r.plan, r.events, r.ready, nil)
	}
	// CPU time, the process's own (garbage collection included): what
	// restores starting beside this one lose, and steadier than ns/op on
	// a loaded host.
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// processCPU is the user and system CPU time of this process so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
