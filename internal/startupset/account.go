package startupset

import (
	"time"

	"warmstart/internal/memdev"
)

// PageBytes is the unit of accounting: the base page, which every device
// serves in multiples of.
const PageBytes = 4096

// Range is a byte range of guest memory (logical offsets).
type Range struct {
	Offset int64
	Length int64
}

// Input is what a restore knows at ready.
type Input struct {
	// StartupSet is the manifest's ranges; empty when the snapshot has no
	// valid manifest (then every page the guest needed is missed).
	StartupSet []Range
	Events     []Event
	// Ready is the time to ready, from the start of the restore.
	Ready time.Duration
	// PrefetchRan is true when the restore joined a prefetch task;
	// PrefetchEnded is when it ended, if before ready (zero otherwise).
	PrefetchRan   bool
	PrefetchEnded time.Duration
}

// Report is the startup-set accounting of one restore. Pages are
// PageBytes each; requests and bytes count only what was served by ready.
type Report struct {
	StartupSetBytes int64 `json:"startup_set_bytes"`
	StartupSetPages int64 `json:"startup_set_pages"`
	// InTimePages were in the guest's reach (prefetched, or resident on a
	// shared device) before any demand request for them, by ready.
	InTimePages int64 `json:"in_time_pages"`
	// LatePages were requested on demand before prefetch brought them in.
	LatePages int64 `json:"late_pages"`
	// UnusedPages were neither brought in nor requested by ready: the
	// guest certainly did not touch them.
	UnusedPages int64 `json:"unused_pages"`
	// MissedPages were requested on demand by ready and are not in the
	// startup set.
	MissedPages int64 `json:"missed_pages"`
	MissedBytes int64 `json:"missed_bytes"`

	DemandRequests   int64 `json:"demand_requests"`
	DemandBytes      int64 `json:"demand_bytes"`
	PrefetchRequests int64 `json:"prefetch_requests"`
	PrefetchBytes    int64 `json:"prefetch_bytes"`

	// PrefetchRan is true when the restore joined a prefetch task.
	PrefetchRan bool `json:"prefetch_ran"`
	// PrefetchEndedBeforeReady is how long before ready the prefetch task
	// ended, negative when it ended while the ready answer was on its way;
	// absent when it had not ended by ready.
	PrefetchEndedBeforeReady *time.Duration `json:"prefetch_ended_before_ready_ns,omitempty"`
}

// pageState is one page's accounting: the event that first brought it
// into the guest's reach (prefetch or resident) and the demand request
// that first asked for it, each as its index in the events plus one (0:
// none), and whether the page is in the set. Indices, not times, keep the
// table at 12 bytes a page: it is allocated and zeroed once per restore.
// An int32 holds them, as a restore's events, kept in memory, number far
// fewer than 2^31 (that would be tens of GiB of events).
type pageState struct {
	reached, demanded int32
	inSet             bool
}

// pageTimes is the accounting of every page the restore named, and the
// pages requested on demand, each once, in the order first requested.
type pageTimes struct {
	events   []Event
	pages    *PageTable[pageState]
	demanded []int64
}

func newPageTimes(in Input) pageTimes {
	var s Span
	for _, r := range in.StartupSet {
		s.Add(r.Offset, r.Length)
	}
	for _, e := range in.Events {
		if e.ByReady(in.Ready) {
			s.Add(e.Offset, int64(e.Length))
		}
	}
	return pageTimes{events: in.Events, pages: NewPageTable[pageState](s)}
}

// reachedAt and demandedAt are the times of a page's first reach and
// demand; valid where its index is not 0.
func (pt *pageTimes) reachedAt(ps pageState) time.Duration { return pt.events[ps.reached-1].At }
func (pt *pageTimes) demandedAt(ps pageState) time.Duration {
	return pt.events[ps.demanded-1].Arrived()
}

// note takes event i into the pages it covers.
func (pt *pageTimes) note(i int) {
	e := pt.events[i]
	first := e.Offset / PageBytes
	if e.Kind != memdev.Demand {
		for p := first; p*PageBytes < e.Offset+int64(e.Length); p++ {
			if ps := pt.pages.At(p); ps.reached == 0 || e.At < pt.reachedAt(*ps) {
				ps.reached = int32(i + 1)
			}
		}
		return
	}
	for p := first; p*PageBytes < e.Offset+int64(e.Length); p++ {
		ps := pt.pages.At(p)
		if ps.demanded == 0 {
			pt.demanded = append(pt.demanded, p)
		}
		if ps.demanded == 0 || e.Arrived() < pt.demandedAt(*ps) {
			ps.demanded = int32(i + 1)
		}
	}
}

// Account classifies every page of the startup set and every page
// requested outside it, from the events up to ready.
func Account(in Input) Report {
	pt := newPageTimes(in)
	var rep Report
	for i, e := range in.Events {
		if !e.ByReady(in.Ready) {
			continue
		}
		pt.note(i)
		switch e.Kind {
		case memdev.Demand:
			rep.DemandRequests++
			rep.DemandBytes += int64(e.Length)
		case memdev.Prefetch:
			rep.PrefetchRequests++
			rep.PrefetchBytes += int64(e.Length)
		}
	}
	rep.classify(in.StartupSet, &pt)
	for _, p := range pt.demanded {
		if !pt.pages.Get(p).inSet {
			rep.MissedPages++
		}
	}
	rep.MissedBytes = rep.MissedPages * PageBytes
	rep.PrefetchRan = in.PrefetchRan
	if in.PrefetchRan && in.PrefetchEnded > 0 {
		d := in.Ready - in.PrefetchEnded
		rep.PrefetchEndedBeforeReady = &d
	}
	return rep
}

// classify counts the startup set's pages by outcome and marks them in
// the set.
func (rep *Report) classify(set []Range, pt *pageTimes) {
	for _, r := range set {
		rep.StartupSetBytes += r.Length
		for p := r.Offset / PageBytes; p*PageBytes < r.Offset+r.Length; p++ {
			ps := pt.pages.At(p)
			if ps.inSet {
				continue
			}
			ps.inSet = true
			rep.StartupSetPages++
			switch {
			case ps.demanded != 0 && (ps.reached == 0 || pt.demandedAt(*ps) < pt.reachedAt(*ps)):
				rep.LatePages++
			case ps.reached != 0:
				rep.InTimePages++
			default:
				rep.UnusedPages++
			}
		}
	}
}
