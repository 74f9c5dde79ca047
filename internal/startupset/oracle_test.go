package startupset

import (
	"time"

	"warmstart/internal/memdev"
)

// oldPageTimes holds, per page, when it first arrived in the guest's reach
// (prefetch or resident) and when it was first requested on demand.
type oldPageTimes struct {
	reached  map[int64]time.Duration
	demanded map[int64]time.Duration
}

func (pt *oldPageTimes) note(e Event) {
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

// oldAccount is the map-based accounting this package had before it
// indexed pages densely: the oracle the current one must agree with.
// It classifies every page of the startup set and every page
// requested outside it, from the events up to ready.
func oldAccount(in Input) Report {
	pt := oldPageTimes{reached: map[int64]time.Duration{}, demanded: map[int64]time.Duration{}}
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
	inSet := oldClassify(&rep, in.StartupSet, pt)
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
func oldClassify(rep *Report, set []Range, pt oldPageTimes) map[int64]bool {
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
