package startupset

import (
	"strings"
	"testing"
	"time"

	"warmstart/internal/memdev"
)

const ms = time.Millisecond

func page(n int64) int64 { return n * PageBytes }

func TestAccountClassifiesEveryPage(t *testing.T) {
	set := []Range{{Offset: 0, Length: page(4)}}
	events := []Event{
		{Kind: memdev.Prefetch, Offset: page(0), Length: PageBytes, At: 1 * ms, Took: ms / 2},
		// Page 1: the guest asked at 2 ms, prefetch came at 3 ms: late.
		{Kind: memdev.Demand, Offset: page(1), Length: PageBytes, At: 2*ms + ms/2, Took: ms / 2},
		{Kind: memdev.Prefetch, Offset: page(1), Length: PageBytes, At: 3 * ms, Took: ms / 2},
		// Page 2: prefetched only after ready, never touched: unused.
		{Kind: memdev.Prefetch, Offset: page(2), Length: PageBytes, At: 20 * ms},
		// Page 3: resident from an earlier VM: in time.
		{Kind: memdev.Resident, Offset: page(3), Length: PageBytes},
		// Pages 7 and 8: outside the set: missed.
		{Kind: memdev.Demand, Offset: page(7), Length: 2 * PageBytes, At: 4 * ms, Took: ms},
		// After ready: ignored.
		{Kind: memdev.Demand, Offset: page(9), Length: PageBytes, At: 30 * ms},
	}
	rep := Account(Input{StartupSet: set, Events: events, Ready: 10 * ms, PrefetchRan: true, PrefetchEnded: 8 * ms})
	want := Report{StartupSetBytes: page(4), StartupSetPages: 4, InTimePages: 2, LatePages: 1, UnusedPages: 1,
		MissedPages: 2, MissedBytes: page(2), DemandRequests: 2, DemandBytes: page(3), PrefetchRequests: 2,
		PrefetchBytes: page(2), PrefetchRan: true}
	got := rep
	got.PrefetchEndedBeforeReady = nil
	if got != want {
		t.Fatalf("report\n got %+v\nwant %+v", got, want)
	}
	if s := rep.PrefetchEndedBeforeReady; s == nil || *s != 2*ms {
		t.Fatalf("prefetch ended before ready = %v, want 2 ms", s)
	}
	line := Line(rep)
	for _, part := range []string{"startup set 0.0 MiB: 50 % in time, 25 % late, 25 % unused", "0.0 MiB missed", "prefetch ended 2 ms before ready"} {
		if !strings.Contains(line, part) {
			t.Errorf("line %q lacks %q", line, part)
		}
	}
}

func TestAccountWithoutPrefetchIsAllLateOrUnused(t *testing.T) {
	set := []Range{{Offset: 0, Length: page(2)}}
	events := []Event{{Kind: memdev.Demand, Offset: 0, Length: PageBytes, At: ms}}
	rep := Account(Input{StartupSet: set, Events: events, Ready: 5 * ms})
	if rep.LatePages != 1 || rep.UnusedPages != 1 || rep.InTimePages != 0 || rep.MissedPages != 0 {
		t.Fatalf("prefetch off: %+v", rep)
	}
	if line := Line(rep); !strings.HasSuffix(line, "; no prefetch") {
		t.Fatalf("line %q", line)
	}
}

func TestLineReadsLikeTheExample(t *testing.T) {
	s := 12 * time.Millisecond
	rep := Report{StartupSetBytes: 40 << 20, StartupSetPages: 100, InTimePages: 96, LatePages: 3, UnusedPages: 1,
		MissedBytes: 4 << 17, PrefetchRan: true, PrefetchEndedBeforeReady: &s}
	want := "startup set 40.0 MiB: 96 % in time, 3 % late, 1 % unused; 0.5 MiB missed; prefetch ended 12 ms before ready"
	if got := Line(rep); got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

// A fault that arrived before ready counts even when its reply was timed
// after the guest's own ready report: the guest needed the page.
func TestDemandCountsByArrival(t *testing.T) {
	set := []Range{{Offset: 0, Length: PageBytes}}
	events := []Event{{Kind: memdev.Demand, Offset: 0, Length: PageBytes, At: 6 * ms, Took: 2 * ms}}
	if rep := Account(Input{StartupSet: set, Events: events, Ready: 5 * ms}); rep.LatePages != 1 || rep.DemandRequests != 1 {
		t.Fatalf("fault arriving at 4 ms, ready at 5 ms: %+v", rep)
	}
}
