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

// pageTimes holds, per page, when it first arrived in the guest's reach
// (prefetch or resident) and when it was first requested on demand.
type pageTimes struct {
	reached  map[int64]time.Duration
	demanded map[int64]time.Duration
}

func (pt *pageTimes) note(e Event) {
	m, at := pt.reached, e.At
	if e.Kind == memdev.Demand {
		m, at = pt.demanded, e.Arrived()
	}
	for p := e.Offset / PageBytes; p*PageBytes < e.Offset+int64(e.Length); p++ {
		if old, ok := m[p]; !ok || at < old {
			m[p] = at
		}
	}
}

// Account classifies every page of the startup set and every page
// requested outside it, from the events up to ready.
func Account(in Input) Report {
	pt := pageTimes{reached: map[int64]time.Duration{}, demanded: map[int64]time.Duration{}}
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
	inSet := rep.classify(in.StartupSet, pt)
	for p := range pt.demanded {
		if !inSet[p] {
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

// classify counts the startup set's pages by outcome and returns the set.
func (rep *Report) classify(set []Range, pt pageTimes) map[int64]bool {
	inSet := map[int64]bool{}
	for _, r := range set {
		rep.StartupSetBytes += r.Length
		for p := r.Offset / PageBytes; p*PageBytes < r.Offset+r.Length; p++ {
			if inSet[p] {
				continue
			}
			inSet[p] = true
			rep.StartupSetPages++
			reached, wasReached := pt.reached[p]
			demanded, wasDemanded := pt.demanded[p]
			switch {
			case wasDemanded && (!wasReached || demanded < reached):
				rep.LatePages++
			case wasReached:
				rep.InTimePages++
			default:
				rep.UnusedPages++
			}
		}
	}
	return inSet
}
