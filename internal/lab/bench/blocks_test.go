package bench

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"warmstart/internal/lab/pagecache"
)

// call is one trial runBlocks asked for.
type call struct {
	block   int
	reserve bool
	cond    Condition
}

// fakeTrials stands in for the trial processes: every trial is admitted
// unless listed in miss, and reports its call's place in the run as its
// time to ready, so a test can tell which trial a result came from.
type fakeTrials struct {
	miss  map[call]bool
	fail  map[call]string // trials that report an error
	calls []call
}

func (f *fakeTrials) run(block int, reserve bool, c Condition) (TrialResult, error) {
	k := call{block, reserve, c}
	f.calls = append(f.calls, k)
	res := TrialResult{
		Spec:     TrialSpec{Block: block, Reserve: reserve, Condition: c},
		Admitted: !f.miss[k],
		ReadyMs:  float64(len(f.calls)),
		Err:      f.fail[k],
	}
	return res, nil
}

// fixedOrders are four blocks, two formal and two reserve, in orders that
// differ per block so that a test sees which order a block ran in.
func fixedOrders() [][]Condition {
	a, b, c := Condition{CacheWarm, PrefetchOff}, Condition{CacheCold, PrefetchOff}, Condition{CacheWarm, "seed"}
	return [][]Condition{{a, b, c}, {c, a, b}, {b, c, a}, {a, c, b}}
}

func TestRunBlocksRunsFormalBlocksInTheirFrozenOrder(t *testing.T) {
	orders := fixedOrders()
	f := &fakeTrials{}
	trials, replaced, err := runBlocks(orders, 2, f.run, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var want []call
	for b := range 2 {
		for _, c := range orders[b] {
			want = append(want, call{b, false, c})
		}
	}
	// All admitted: the reserve blocks are never touched.
	if !slices.Equal(f.calls, want) {
		t.Errorf("ran %v, want %v", f.calls, want)
	}
	if len(trials) != 6 || len(replaced) != 0 {
		t.Errorf("%d trials, replaced %v; want 6 trials and no replacement", len(trials), replaced)
	}
}

func TestMissedTrialIsReplacedBySameConditionFromFirstReserveBlock(t *testing.T) {
	orders := fixedOrders()
	missed := call{1, false, Condition{CacheCold, PrefetchOff}}
	f := &fakeTrials{miss: map[call]bool{missed: true}}
	trials, replaced, err := runBlocks(orders, 2, f.run, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Reserve block index 2 (the first after the two formal blocks) runs
	// the missed condition once, after every formal trial.
	if last := f.calls[len(f.calls)-1]; len(f.calls) != 7 || last != (call{2, true, missed.cond}) {
		t.Fatalf("ran %v; want the six formal trials then %v", f.calls, call{2, true, missed.cond})
	}
	// The missed trial stays in the raw trials; the replacement follows it
	// and takes its place in block 1 (0-based), marked as a reserve trial.
	if len(trials) != 7 || trials[5].Admitted {
		t.Fatalf("trials %+v", trials)
	}
	got := trials[6]
	if !got.Admitted || got.Spec.Block != 1 || !got.Spec.Reserve || got.Spec.Condition != missed.cond || got.ReadyMs != 7 {
		t.Errorf("replacement %+v; want the admitted reserve trial in block 1", got)
	}
	want := []string{"block 2 file-cold/prefetch-off replaced from reserve block 3"}
	if !slices.Equal(replaced, want) {
		t.Errorf("replaced %q, want %q", replaced, want)
	}
}

func TestReplacementsFollowTheOrderTrialsMissedIn(t *testing.T) {
	orders := fixedOrders()
	warmOff, coldOff, warmSeed := orders[0][0], orders[0][1], orders[0][2]
	f := &fakeTrials{miss: map[call]bool{
		{0, false, warmSeed}: true,
		{1, false, warmOff}:  true,
		{1, false, coldOff}:  true,
	}}
	trials, replaced, err := runBlocks(orders, 2, f.run, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Not the reserve block's own order (cold-off, seed, warm-off): the
	// order in which the formal trials missed.
	want := []call{{2, true, warmSeed}, {2, true, warmOff}, {2, true, coldOff}}
	if !slices.Equal(f.calls[6:], want) {
		t.Errorf("replacements ran %v, want %v", f.calls[6:], want)
	}
	blocks := []int{trials[6].Spec.Block, trials[7].Spec.Block, trials[8].Spec.Block}
	if !slices.Equal(blocks, []int{0, 1, 1}) || len(replaced) != 3 {
		t.Errorf("replacements in blocks %v, replaced %q", blocks, replaced)
	}
}

func TestReplacementThatMissesMovesToTheNextReserveBlock(t *testing.T) {
	orders := fixedOrders()
	c := orders[0][1]
	f := &fakeTrials{miss: map[call]bool{
		{0, false, c}: true,
		{2, true, c}:  true, // the first reserve block misses as well
	}}
	trials, replaced, err := runBlocks(orders, 2, f.run, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := []call{{2, true, c}, {3, true, c}}; !slices.Equal(f.calls[6:], want) {
		t.Errorf("replacements ran %v, want %v", f.calls[6:], want)
	}
	// The reserve trial that missed is not kept; only the admitted one.
	if len(trials) != 7 || !trials[6].Admitted || trials[6].Spec.Block != 0 || trials[6].ReadyMs != 8 {
		t.Errorf("trials %+v", trials)
	}
	if want := []string{"block 1 file-cold/prefetch-off replaced from reserve block 4"}; !slices.Equal(replaced, want) {
		t.Errorf("replaced %q, want %q", replaced, want)
	}
}

// TestReserveBlockServesUntilOneOfItsTrialsMisses pins how reserve blocks
// are counted today: an admitted replacement does not use its reserve
// block up, so two misses of one condition both come from the same one.
func TestReserveBlockServesUntilOneOfItsTrialsMisses(t *testing.T) {
	orders := fixedOrders()
	c := orders[0][0]
	f := &fakeTrials{miss: map[call]bool{{0, false, c}: true, {1, false, c}: true}}
	_, replaced, err := runBlocks(orders, 2, f.run, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"block 1 file-warm/prefetch-off replaced from reserve block 3",
		"block 2 file-warm/prefetch-off replaced from reserve block 3",
	}
	if !slices.Equal(replaced, want) {
		t.Errorf("replaced %q, want %q", replaced, want)
	}
}

func TestReservesUsedUpIsAnErrorAndKeepsWhatRan(t *testing.T) {
	orders := fixedOrders()
	a, b := orders[0][0], orders[0][1]
	f := &fakeTrials{miss: map[call]bool{
		{0, false, a}: true,
		{1, false, b}: true,
		{2, true, b}:  true,
		{3, true, b}:  true,
	}}
	trials, replaced, err := runBlocks(orders, 2, f.run, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "1 trials missed admission and the reserve blocks are used up") {
		t.Fatalf("err %v; want the one unreplaced trial reported", err)
	}
	// a was replaced before the reserves ran out; b never was.
	if want := []string{"block 1 file-warm/prefetch-off replaced from reserve block 3"}; !slices.Equal(replaced, want) {
		t.Errorf("replaced %q, want %q", replaced, want)
	}
	if len(trials) != 7 {
		t.Errorf("%d trials, want the six formal ones and one replacement", len(trials))
	}
	// The summary of what ran leaves out both trials that missed.
	s := summarize(Options{Blocks: 2, Policies: []string{"seed"}}, trials)
	if s.Admitted != 5 {
		t.Errorf("summary counts %d admitted trials, want 5", s.Admitted)
	}
	for _, cell := range s.Cells {
		if cell.Condition == b && cell.Sample.N != 1 {
			t.Errorf("%s: %d values, want only block 1's", b, cell.Sample.N)
		}
	}
}

func TestNoReserveBlocksAMissIsAnError(t *testing.T) {
	orders := fixedOrders()[:2]
	f := &fakeTrials{miss: map[call]bool{{1, false, orders[1][2]}: true}}
	if _, _, err := runBlocks(orders, 2, f.run, io.Discard); err == nil {
		t.Fatal("a miss without reserve blocks was accepted")
	}
	if len(f.calls) != 6 {
		t.Errorf("ran %d trials, want only the six formal ones", len(f.calls))
	}
}

func TestTrialErrorsStopTheRun(t *testing.T) {
	orders := fixedOrders()
	bad := call{0, false, orders[0][1]}
	f := &fakeTrials{fail: map[call]string{bad: "boom"}}
	trials, _, err := runBlocks(orders, 2, f.run, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "block 1 file-cold/prefetch-off: boom") {
		t.Errorf("err %v", err)
	}
	if len(f.calls) != 2 || len(trials) != 1 {
		t.Errorf("ran %d trials, kept %d; want the run stopped at the failed one", len(f.calls), len(trials))
	}

	// A failing replacement stops it too.
	c := orders[0][0]
	f = &fakeTrials{miss: map[call]bool{{0, false, c}: true}, fail: map[call]string{{2, true, c}: "boom"}}
	if _, _, err := runBlocks(orders, 2, f.run, io.Discard); err == nil || !strings.Contains(err.Error(), "reserve block 3") {
		t.Errorf("err %v", err)
	}

	// So does a trial that could not be run at all.
	launchErr := errors.New("no such executable")
	n := 0
	run := func(int, bool, Condition) (TrialResult, error) {
		n++
		return TrialResult{}, launchErr
	}
	if _, _, err := runBlocks(orders, 2, run, io.Discard); !errors.Is(err, launchErr) || n != 1 {
		t.Errorf("err %v after %d trials", err, n)
	}
}

func TestAdmissionColdNoPageWarmEveryPage(t *testing.T) {
	for _, c := range []struct {
		cache    string
		resident int64
		want     bool
	}{
		{CacheCold, 0, true},
		{CacheCold, 1, false},
		{CacheCold, 100, false},
		{CacheWarm, 100, true},
		{CacheWarm, 99, false},
		{CacheWarm, 0, false},
		{CacheHot, 100, true},
		{CacheHot, 99, false},
	} {
		if got := admitted(c.cache, pagecache.Residency{Resident: c.resident, Total: 100}); got != c.want {
			t.Errorf("%s with %d/100 pages resident: admitted %v, want %v", c.cache, c.resident, got, c.want)
		}
	}
}

func TestETAFromTheTrialsDoneSoFar(t *testing.T) {
	if got := etaSuffix(time.Hour, 1, 10); got != "" {
		t.Errorf("first trial: %q, want no estimate", got)
	}
	// Two trials took 10 s: 5 s each, and trials 3 to 10 are left.
	if got := etaSuffix(10*time.Second, 3, 10); got != ", ETA 40s" {
		t.Errorf("got %q, want , ETA 40s", got)
	}
}

// TestPilotNotAdmittedRunsAgain: a pilot whose residency probe missed its
// threshold carries no answer; it runs again instead of being reported as
// a guest that answered without a token, and a pilot never admitted fails
// saying so.
func TestPilotNotAdmittedRunsAgain(t *testing.T) {
	missed := TrialResult{Admitted: false}
	answered := TrialResult{Admitted: true, Token: "0123abcd"}
	results := []TrialResult{missed, answered}
	runs := 0
	run := func(context.Context, TrialSpec) (TrialResult, error) {
		res := results[min(runs, len(results)-1)]
		runs++
		return res, nil
	}
	pilot, err := runPilot(context.Background(), run, TrialSpec{})
	if err != nil || pilot.Token != "0123abcd" || runs != 2 {
		t.Fatalf("pilot %+v, %v after %d runs; want the second run's token", pilot, err, runs)
	}

	runs = 0
	never := func(context.Context, TrialSpec) (TrialResult, error) { runs++; return missed, nil }
	_, err = runPilot(context.Background(), never, TrialSpec{})
	if err == nil || !strings.Contains(err.Error(), "not admitted") || runs != pilotAttempts {
		t.Fatalf("never admitted: %v after %d runs; want an error saying so after %d", err, runs, pilotAttempts)
	}

	runs = 0
	silent := func(context.Context, TrialSpec) (TrialResult, error) { runs++; return TrialResult{Admitted: true}, nil }
	_, err = runPilot(context.Background(), silent, TrialSpec{})
	if err == nil || !strings.Contains(err.Error(), "without a token") || runs != 1 {
		t.Fatalf("admitted without a token: %v after %d runs; want that error at once", err, runs)
	}
}
