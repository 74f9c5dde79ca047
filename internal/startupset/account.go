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

// pageState is one page's accounting: when it first arrived in the
// guest's reach (prefetch or resident), when it was first requested on
// demand, and which of those happened, and whether it is in the set.
type pageState struct {
	reached, demanded time.Duration
	flags             uint8
}

const (
	wasReached uint8 = 1 << iota
	wasDemanded
	inSet
)

// pageTimes is the accounting of every page the restore named, and the
// pages requested on demand, each once, in the order first requested.
type pageTimes struct {
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
	return pageTimes{pages: NewPageTable[pageState](s)}
}

func (pt *pageTimes) note(e Event) {
	flag, at := wasReached, e.At
	if e.Kind == memdev.Demand {
		flag, at = wasDemanded, e.Arrived()
	}
	for p := e.Offset / PageBytes; p*PageBytes < e.Offset+int64(e.Length); p++ {
		ps := pt.pages.At(p)
		t := &ps.reached
		if flag == wasDemanded {
			t = &ps.demanded
		}
		switch {
		case ps.flags&flag == 0:
			if flag == wasDemanded {
				pt.demanded = append(pt.demanded, p)
			}
			ps.flags |= flag
			*t = at
		case at < *t:
			*t = at
		}
	}
}

// Account classifies every page of the startup set and every page
// requested outside it, from the events up to ready.
func Account(in Input) Report {
	pt := newPageTimes(in)
	var rep Report
	for _, e := range in.Events {
		if !e.ByReady(in.Ready) {
			continue
		}
		pt.note(e)
		switch e.Kind {
		case memdev.Demand:
			rep.DemandRequests++
			rep.DemandBytes += int64(e.Length)
		case memdev.Prefetch:
			rep.PrefetchRequests++
			rep.PrefetchBytes += int64(e.Length)
		}
	}
	rep.classify(in.StartupSet, pt.pages)
	for _, p := range pt.demanded {
		if pt.pages.Get(p).flags&inSet == 0 {
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
func (rep *Report) classify(set []Range, pages *PageTable[pageState]) {
	for _, r := range set {
		rep.StartupSetBytes += r.Length
		for p := r.Offset / PageBytes; p*PageBytes < r.Offset+r.Length; p++ {
			ps := pages.At(p)
			if ps.flags&inSet != 0 {
				continue
			}
			ps.flags |= inSet
			rep.StartupSetPages++
			reached, demanded := ps.flags&wasReached != 0, ps.flags&wasDemanded != 0
			switch {
			case demanded && (!reached || ps.demanded < ps.reached):
				rep.LatePages++
			case reached:
				rep.InTimePages++
			default:
				rep.UnusedPages++
			}
		}
	}
}
