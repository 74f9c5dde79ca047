package refine

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/startupset"
)

const ms = time.Millisecond

var testLayout = layout.Single(64 << 20)

// base is a recorded manifest of pages in this first-touch order.
func base(t testing.TB, pages ...int64) (*manifest.Manifest, State) {
	t.Helper()
	offs := make([]int64, len(pages))
	for i, p := range pages {
		offs[i] = p * PageBytes
	}
	m, err := manifest.Build(testLayout, offs)
	if err != nil {
		t.Fatal(err)
	}
	data, err := manifest.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return m, Initial(m, manifest.Digest(data))
}

func order(s State) []int64 {
	var out []int64
	for _, p := range s.Pages {
		out = append(out, p.Page)
	}
	return out
}

func prefetched(page int64, at time.Duration) startupset.Event {
	return startupset.Event{Kind: memdev.Prefetch, Offset: page * PageBytes, Length: PageBytes, At: at}
}

func demanded(page int64, at time.Duration) startupset.Event {
	return startupset.Event{Kind: memdev.Demand, Offset: page * PageBytes, Length: PageBytes, At: at + ms/10, Took: ms / 10}
}

func pages(from, to int64) []int64 {
	var out []int64
	for p := from; p < to; p++ {
		out = append(out, p)
	}
	return out
}

func TestInitialIsTheRecordedManifest(t *testing.T) {
	m, s := base(t, 5, 6, 7, 1, 2, 40)
	want, _ := manifest.Encode(m)
	_, got, err := s.Manifest(testLayout)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("initial state's manifest differs from the recorded one")
	}
	if s.BasePages != 6 || !slices.Equal(order(s), []int64{5, 6, 7, 1, 2, 40}) {
		t.Fatalf("initial state %+v", s)
	}
}

func TestMissedPageEntersWhereTheGuestNeededIt(t *testing.T) {
	cases := []struct {
		name   string
		events []startupset.Event
		want   []int64
	}{{
		// Prefetch had brought in pages 0..2 when the guest needed page
		// 100: it goes before page 3, so it comes in before it is needed.
		name: "prefetch position",
		events: []startupset.Event{prefetched(0, 1*ms), prefetched(1, 2*ms), prefetched(2, 3*ms),
			demanded(100, 3*ms+ms/2), prefetched(3, 4*ms), prefetched(4, 5*ms)},
		want: []int64{0, 1, 2, 100, 3, 4, 5, 6, 7, 8, 9},
	}, {
		// The guest had got to plan page 3 (late) while prefetch was far
		// ahead: the guest's position is the earlier one.
		name: "guest position",
		events: []startupset.Event{prefetched(0, ms/2), demanded(3, ms/2), prefetched(3, 1*ms), prefetched(1, 1*ms),
			prefetched(2, 1*ms), prefetched(4, 1*ms), prefetched(5, 1*ms), prefetched(6, 1*ms), prefetched(7, 1*ms),
			demanded(100, 2*ms), demanded(101, 2*ms+ms/2)},
		want: []int64{0, 1, 2, 3, 100, 101, 4, 5, 6, 7, 8, 9},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, s := base(t, pages(0, 10)...)
			res := s.Apply(FromEvents(m.Ranges, c.events, 10*ms, nil), Options{})
			if got := order(s); !slices.Equal(got, c.want) {
				t.Fatalf("order %v, want %v", got, c.want)
			}
			if res.Added == 0 || s.Restores != 1 {
				t.Fatalf("result %+v, restores %d", res, s.Restores)
			}
		})
	}
}

func TestUntouchedPagesAgeOutAfterThreeRestores(t *testing.T) {
	m, s := base(t, pages(0, 4)...)
	// Pages 0..2 come in; page 3 is neither brought in nor asked for.
	events := []startupset.Event{prefetched(0, ms), prefetched(1, ms), prefetched(2, ms)}
	obs := FromEvents(m.Ranges, events, 5*ms, nil)
	for i := 1; i <= 2; i++ {
		s.Apply(obs, Options{})
		if len(s.Pages) != 4 {
			t.Fatalf("after %d untouched restores the page left already: %v", i, order(s))
		}
	}
	// A restore that needs page 3 starts its count over.
	s.Apply(FromEvents(m.Ranges, append(events, demanded(3, 2*ms)), 5*ms, nil), Options{})
	s.Apply(obs, Options{})
	s.Apply(obs, Options{})
	if len(s.Pages) != 4 {
		t.Fatalf("needed page aged out early: %v", order(s))
	}
	res := s.Apply(obs, Options{})
	if got := order(s); !slices.Equal(got, []int64{0, 1, 2}) || res.AgedOut != 1 {
		t.Fatalf("after 3 untouched restores in a row: %v (%+v)", got, res)
	}
}

func TestKnownUntouchedPagesAgeOutEvenWhenPrefetched(t *testing.T) {
	m, s := base(t, pages(0, 3)...)
	events := []startupset.Event{prefetched(0, ms), prefetched(1, ms), prefetched(2, ms)}
	touched := func(p int64) (bool, bool) { return p != 1, true }
	for range DefaultAgeOut {
		s.Apply(FromEvents(m.Ranges, events, 5*ms, touched), Options{})
	}
	if got := order(s); !slices.Equal(got, []int64{0, 2}) {
		t.Fatalf("order %v, want page 1 gone", got)
	}
	if s.Pages[0].Seen != DefaultAgeOut {
		t.Fatalf("touched page seen %d times", s.Pages[0].Seen)
	}
}

func TestLatePagesMoveTowardTheGuestsOrder(t *testing.T) {
	m, s := base(t, pages(0, 10)...)
	// Prefetch is slow; the guest asks for page 6 before page 2.
	events := []startupset.Event{prefetched(0, ms), prefetched(1, ms), demanded(6, 2*ms), demanded(2, 3*ms)}
	for _, p := range []int64{2, 3, 4, 5, 6, 7, 8, 9} {
		events = append(events, prefetched(p, 4*ms))
	}
	res := s.Apply(FromEvents(m.Ranges, events, 10*ms, nil), Options{})
	// Page 6 moves halfway toward just before page 2: rank 3.75.
	if got, want := order(s), []int64{0, 1, 2, 3, 6, 4, 5, 7, 8, 9}; !slices.Equal(got, want) || res.Moved != 1 {
		t.Fatalf("order %v, want %v (%+v)", got, want, res)
	}
	// Again and again: it converges to just before page 2.
	for range 4 {
		s.Apply(FromEvents(m.Ranges, events, 10*ms, nil), Options{})
	}
	if got, want := order(s), []int64{0, 1, 6, 2, 3, 4, 5, 7, 8, 9}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestMoveIsBounded(t *testing.T) {
	m, s := base(t, pages(0, 1000)...)
	events := []startupset.Event{demanded(900, ms), demanded(0, 2*ms)}
	s.Apply(FromEvents(m.Ranges, events, 10*ms, nil), Options{MaxStep: 10})
	// Rank 890 exactly, after page 890 (a tie keeps the older order).
	if i := slices.Index(order(s), 900); i != 891 {
		t.Fatalf("page 900 now at rank %d, want 891 (step bound 10)", i)
	}
}

// A restore that matched its plan, prefetch ahead of the guest or behind
// it but in the plan's order, leaves the manifest byte for byte.
func TestMatchedRestoreKeepsTheManifest(t *testing.T) {
	m, s := base(t, 5, 6, 7, 1, 2, 40, 41, 9)
	_, want, _ := s.Manifest(testLayout)
	ahead := []startupset.Event{}
	behind := []startupset.Event{}
	for i, p := range order(s) {
		ahead = append(ahead, prefetched(p, time.Duration(i)*ms/10))
		behind = append(behind, demanded(p, time.Duration(i+1)*ms), prefetched(p, time.Duration(i+1)*ms+ms/2))
	}
	for range 5 {
		for _, events := range [][]startupset.Event{ahead, behind} {
			res := s.Apply(FromEvents(m.Ranges, events, 20*ms, nil), Options{})
			if res.Added+res.Moved+res.AgedOut+res.Evicted != 0 {
				t.Fatalf("matched restore changed the state: %+v", res)
			}
		}
	}
	if _, got, _ := s.Manifest(testLayout); !bytes.Equal(got, want) {
		t.Fatalf("manifest changed after matched restores: %v", order(s))
	}
}

func TestStateStaysWithinMaxPages(t *testing.T) {
	m, s := base(t, pages(0, 4)...)
	events := []startupset.Event{prefetched(0, ms), prefetched(1, ms), prefetched(2, ms), prefetched(3, ms)}
	for p := int64(100); p < 110; p++ {
		events = append(events, demanded(p, 2*ms))
	}
	res := s.Apply(FromEvents(m.Ranges, events, 5*ms, nil), Options{MaxPages: 8})
	if len(s.Pages) != 8 || res.Evicted != 6 {
		t.Fatalf("%d pages, %+v", len(s.Pages), res)
	}
	// The latest ranked went: the base and the first missed pages stay.
	if got, want := order(s), []int64{0, 1, 2, 3, 100, 101, 102, 103}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if o := (Options{}).withDefaults(&State{BasePages: 10 << 20}); o.MaxPages != maxManifestPages {
		t.Fatalf("default bound %d exceeds what a manifest holds", o.MaxPages)
	}
}

func TestReadaroundWindowCountsWhatTheDeviceCanTell(t *testing.T) {
	window := startupset.Event{Kind: memdev.Demand, Offset: 64 * PageBytes, Length: 32 * PageBytes, At: ms}
	obs := FromEvents(nil, []startupset.Event{window}, 5*ms, nil)
	if len(obs.Demands) != 1 || obs.Demands[0].Page != 80 {
		t.Fatalf("without touched: %+v, want the middle page 80", obs.Demands)
	}
	// A window around a late plan page: the plan pages in it, no guess.
	obs = FromEvents([]manifest.Range{{Offset: 79 * PageBytes, Length: 2 * PageBytes}}, []startupset.Event{window}, 5*ms, nil)
	if len(obs.Demands) != 2 || obs.Demands[0].Page != 79 || obs.Demands[1].Page != 80 || obs.Demands[0].PlanIndex != 0 {
		t.Fatalf("window over plan pages: %+v, want pages 79 and 80, late", obs.Demands)
	}
	touched := func(p int64) (bool, bool) { return p == 70 || p == 71, true }
	obs = FromEvents(nil, []startupset.Event{window}, 5*ms, touched)
	if len(obs.Demands) != 2 || obs.Demands[0].Page != 70 || obs.Demands[1].Page != 71 {
		t.Fatalf("with touched: %+v, want pages 70 and 71", obs.Demands)
	}
}

func TestEncodeRoundTrips(t *testing.T) {
	m, s := base(t, 3, 4, 9)
	s.Apply(FromEvents(m.Ranges, []startupset.Event{demanded(20, ms)}, 5*ms, nil), Options{})
	data, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.BaseSHA256 != s.BaseSHA256 || got.Restores != 1 || got.BasePages != 3 || !slices.Equal(got.Pages, s.Pages) {
		t.Fatalf("decoded %+v, want %+v", got, s)
	}
}

func FuzzDecode(f *testing.F) {
	_, s := base(f, 1, 2, 3)
	data, _ := s.Encode()
	f.Add(data)
	f.Add(data[:headerBytes])
	f.Add([]byte("WSREFST\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Decode(data)
		if err != nil {
			return
		}
		again, err := s.Encode()
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("accepted state does not re-encode to its input: %v", err)
		}
		_, _, _ = s.Manifest(testLayout)
	})
}
