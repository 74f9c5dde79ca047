package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"warmstart/internal/config"
)

var (
	warmOff  = Condition{CacheWarm, PrefetchOff}
	coldOff  = Condition{CacheCold, PrefetchOff}
	warmSeed = Condition{CacheWarm, "seed"}
	coldSeed = Condition{CacheCold, "seed"}
	hotOff   = Condition{CacheHot, PrefetchOff}
)

// admittedTrial is a correct trial of c in block that was ready in ms.
func admittedTrial(block int, c Condition, ms float64) TrialResult {
	return TrialResult{Spec: TrialSpec{Block: block, Condition: c}, Admitted: true, HashOK: true, ReadyMs: ms}
}

// missedTrial is a trial that missed admission: it was never timed, so it
// has neither a time nor a hash check.
func missedTrial(block int, c Condition) TrialResult {
	return TrialResult{Spec: TrialSpec{Block: block, Condition: c}, ReadyMs: 1e6}
}

// trialsOf builds admitted trials from each condition's times by block.
func trialsOf(byCond map[Condition][]float64) []TrialResult {
	var ts []TrialResult
	for c, xs := range byCond {
		for b, x := range xs {
			ts = append(ts, admittedTrial(b, c, x))
		}
	}
	return ts
}

func cellOf(t *testing.T, s Summary, c Condition) Cell {
	t.Helper()
	for _, cell := range s.Cells {
		if cell.Condition == c {
			return cell
		}
	}
	t.Fatalf("no cell for %v", c)
	return Cell{}
}

func pairOf(t *testing.T, s Summary, policy, label string) Interval {
	t.Helper()
	for _, p := range s.Pairs {
		if p.Policy == policy && p.Label == label {
			return p.Interval
		}
	}
	t.Fatalf("no pair %q %q", policy, label)
	return Interval{}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestRatiosAreToPrefetchOffOfTheSameCacheState(t *testing.T) {
	o := Options{Device: config.DeviceFile, Blocks: 2, Policies: []string{"seed"}, Hot: true}
	s := summarize(o, trialsOf(map[Condition][]float64{
		warmOff: {10, 20}, warmSeed: {6, 9},
		coldOff: {40, 60}, coldSeed: {10, 15},
		hotOff: {4, 6},
	}))
	for c, want := range map[Condition]float64{warmOff: 1, warmSeed: 0.5, coldOff: 1, coldSeed: 0.25} {
		if got := cellOf(t, s, c).Ratio; !near(got, want) {
			t.Errorf("%v: ratio %v, want %v", c, got, want)
		}
	}
	// The hot control has no prefetch-off baseline of its own to compare.
	if got := cellOf(t, s, hotOff); got.Ratio != 0 || got.Sample.Mean != 5 {
		t.Errorf("hot control %+v; want mean 5 and no ratio", got)
	}
}

func TestPairsOnlyOverBlocksWhereBothConditionsHaveAResult(t *testing.T) {
	o := Options{Blocks: 3, Policies: []string{"seed"}}
	trials := trialsOf(map[Condition][]float64{warmOff: {10, 20, 30}, coldOff: {50, 50, 50}, coldSeed: {40, 40, 40}})
	// warm seed missed admission in block 1 and was not replaced.
	trials = append(trials, admittedTrial(0, warmSeed, 5), missedTrial(1, warmSeed), admittedTrial(2, warmSeed, 26))
	s := summarize(o, trials)

	w := pairOf(t, s, "seed", "file-warm: prefetch on minus off")
	// Blocks 0 and 2: 5-10 and 26-30. Block 1's prefetch-off 20 is no pair.
	if w.N != 2 || !near(w.Mean, -4.5) || !w.AllNegative {
		t.Errorf("warm pair %+v; want n=2, mean -4.5", w)
	}
	if got := cellOf(t, s, warmOff).Sample; got.N != 3 || got.Mean != 20 {
		t.Errorf("warm off sample %+v; want all three blocks", got)
	}
	if got := cellOf(t, s, warmSeed).Sample; got.N != 2 || !near(got.Mean, 15.5) {
		t.Errorf("warm seed sample %+v; the missed trial's time must not count", got)
	}
	if s.Admitted != 11 || !s.AllHashesOK {
		t.Errorf("admitted %d, all hashes %v; want 11 and the missed trial ignored", s.Admitted, s.AllHashesOK)
	}
	// Every remaining pair is faster, but one block has no pair.
	if s.FasterEveryPair["seed"] {
		t.Error("faster in every pair with a pair missing")
	}
	cw := pairOf(t, s, "seed", "prefetch on: file-cold minus file-warm")
	if cw.N != 2 || !near(cw.Mean, (35+14)/2.0) {
		t.Errorf("cold minus warm with prefetch %+v", cw)
	}
}

func TestReplacementCountsInTheBlockItReplaces(t *testing.T) {
	o := Options{Blocks: 2, Policies: []string{"seed"}}
	trials := trialsOf(map[Condition][]float64{warmOff: {10, 20}, coldOff: {30, 30}, coldSeed: {20, 20}})
	repl := admittedTrial(1, warmSeed, 14) // from a reserve block, given block 1
	repl.Spec.Reserve = true
	trials = append(trials, admittedTrial(0, warmSeed, 8), missedTrial(1, warmSeed), repl)
	w := pairOf(t, summarize(o, trials), "seed", "file-warm: prefetch on minus off")
	if w.N != 2 || !near(w.Mean, (-2-6)/2.0) {
		t.Errorf("warm pair %+v; want the replacement paired with block 1", w)
	}
}

func TestFasterEveryPairNeedsEveryBlockFasterInBothCacheStates(t *testing.T) {
	o := Options{Blocks: 2, Policies: []string{"seed"}}
	for _, c := range []struct {
		name               string
		warmSeed, coldSeed []float64
		want               bool
	}{
		{"faster everywhere", []float64{9, 9}, []float64{19, 19}, true},
		{"one cold block slower", []float64{9, 9}, []float64{19, 21}, false},
		{"one warm block equal", []float64{10, 9}, []float64{19, 19}, false},
		{"faster warm only", []float64{9, 9}, []float64{21, 21}, false},
	} {
		s := summarize(o, trialsOf(map[Condition][]float64{
			warmOff: {10, 10}, coldOff: {20, 20}, warmSeed: c.warmSeed, coldSeed: c.coldSeed,
		}))
		if got := s.FasterEveryPair["seed"]; got != c.want {
			t.Errorf("%s: faster in every pair %v, want %v", c.name, got, c.want)
		}
	}
}

func TestPairsPerPolicyThenPrefetchOffThenVerification(t *testing.T) {
	o := Options{Blocks: 2, Policies: []string{"seed", "off+noverify"}}
	noverify := func(cache string) Condition { return Condition{cache, "off+noverify"} }
	s := summarize(o, trialsOf(map[Condition][]float64{
		warmOff: {10, 12}, coldOff: {30, 34}, warmSeed: {8, 8}, coldSeed: {20, 20},
		noverify(CacheWarm): {9, 9}, noverify(CacheCold): {25, 25},
	}))
	want := []struct {
		policy, label string
		mean          float64
	}{
		{"seed", "file-warm: prefetch on minus off", -3},
		{"seed", "file-cold: prefetch on minus off", -12},
		{"seed", "prefetch on: file-cold minus file-warm", 12},
		{"", "prefetch off: file-cold minus file-warm", 21},
		{PrefetchOff, "file-warm: verified minus unverified", 2},
		{PrefetchOff, "file-cold: verified minus unverified", 7},
	}
	if len(s.Pairs) != len(want) {
		t.Fatalf("%d pairs %+v, want %d", len(s.Pairs), s.Pairs, len(want))
	}
	for i, w := range want {
		p := s.Pairs[i]
		if p.Policy != w.policy || p.Label != w.label || !near(p.Interval.Mean, w.mean) {
			t.Errorf("pair %d: %q %q %v, want %q %q %v", i, p.Policy, p.Label, p.Interval.Mean, w.policy, w.label, w.mean)
		}
	}
	// Prefetch off unverified does not prefetch: no verdict for it.
	if _, ok := s.FasterEveryPair["off+noverify"]; ok {
		t.Error("a verdict on prefetching for off+noverify")
	}
}

func TestSummaryChecksAndDeviceBytesOverAdmittedTrials(t *testing.T) {
	o := Options{Blocks: 2, Policies: []string{"seed"}}
	a, b := admittedTrial(0, warmOff, 10), admittedTrial(1, warmOff, 10)
	a.ProbeGap, b.ProbeGap = 3*time.Microsecond, 7*time.Microsecond
	a.DeviceBytes.BytesRead, b.DeviceBytes.BytesRead = 1<<20, 3<<20
	missed := missedTrial(0, coldOff)
	missed.ProbeGap = time.Second
	s := summarize(o, []TrialResult{b, a, missed}) // the largest gap not last
	if s.MaxProbeGap != 7*time.Microsecond || !s.AllHashesOK || s.Admitted != 2 {
		t.Errorf("max gap %v, all hashes %v, admitted %d", s.MaxProbeGap, s.AllHashesOK, s.Admitted)
	}
	if got := cellOf(t, s, warmOff).DeviceMiB; got != 2 {
		t.Errorf("device MiB %v, want the mean 2", got)
	}
	b.HashOK = false
	if summarize(o, []TrialResult{a, b}).AllHashesOK {
		t.Error("all hashes correct with an admitted trial's hash wrong")
	}
}

// oneBlockReport is a run of a single block: each paired difference has
// one pair and so no interval.
func oneBlockReport() *Report {
	o := Options{Blocks: 1, Policies: []string{"seed"}}
	return &Report{
		Options: ReportOptions{Blocks: 1, Policies: o.Policies},
		Summary: summarize(o, trialsOf(map[Condition][]float64{
			warmOff: {10}, coldOff: {30}, warmSeed: {8}, coldSeed: {20},
		})),
	}
}

func TestOneBlockPrintsNoInterval(t *testing.T) {
	var out bytes.Buffer
	oneBlockReport().WriteTable(&out)
	table := out.String()
	if got := fieldsOfLine(table, "file-warm: prefetch on minus off"); got != "seed file-warm: prefetch on minus off -2.000 ms n=1, no interval" {
		t.Errorf("warm pair printed %q:\n%s", got, table)
	}
	// Not a zero-width interval around the mean.
	if strings.Contains(table, "[-2.000, -2.000]") || strings.Count(table, "no interval") != 4 {
		t.Errorf("want every pair printed without an interval:\n%s", table)
	}
}

func TestOneBlockJSONMarksNoInterval(t *testing.T) {
	data, err := json.Marshal(oneBlockReport())
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Summary struct {
			Pairs []struct {
				Interval map[string]any `json:"interval"`
			} `json:"pairs"`
		} `json:"summary"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Summary.Pairs) == 0 {
		t.Fatal("no pairs")
	}
	for _, p := range rep.Summary.Pairs {
		iv := p.Interval
		_, low := iv["low_ms"]
		_, high := iv["high_ms"]
		if iv["no_interval"] != true || low || high || iv["n"] != 1.0 {
			t.Errorf("interval %v; want n=1 marked no_interval, without bounds", iv)
		}
	}
}

func TestIntervalJSONKeepsBoundsFromTwoPairs(t *testing.T) {
	data, err := json.Marshal(PairedInterval([]float64{-3, -1}))
	if err != nil {
		t.Fatal(err)
	}
	var iv map[string]any
	if err := json.Unmarshal(data, &iv); err != nil {
		t.Fatal(err)
	}
	if _, marked := iv["no_interval"]; marked || !near(iv["low_ms"].(float64), -2-12.706) || !near(iv["high_ms"].(float64), -2+12.706) {
		t.Errorf("two pairs: %s", data)
	}
}

func TestTwoBlocksPrintAnInterval(t *testing.T) {
	o := Options{Blocks: 2, Policies: []string{"seed"}}
	rep := &Report{
		Options: ReportOptions{Blocks: 2, Policies: o.Policies},
		Summary: summarize(o, trialsOf(map[Condition][]float64{
			warmOff: {10, 10}, coldOff: {30, 30}, warmSeed: {7, 9}, coldSeed: {20, 20},
		})),
	}
	var out bytes.Buffer
	rep.WriteTable(&out)
	// Differences -3 and -1: mean -2, half-width 12.706 * 1 / 1.
	table := out.String()
	if got := fieldsOfLine(table, "file-warm: prefetch on minus off"); got != "seed file-warm: prefetch on minus off -2.000 ms [-14.706, +10.706] ms n=2" {
		t.Errorf("warm pair printed %q:\n%s", got, table)
	}
}

// fieldsOfLine returns the first line of table that contains s, its
// fields joined by single spaces (the table's column padding varies).
func fieldsOfLine(table, s string) string {
	for _, line := range strings.Split(table, "\n") {
		if strings.Contains(line, s) {
			return strings.Join(strings.Fields(line), " ")
		}
	}
	return ""
}

// TestNoPairPrintsNeitherMeanNorInterval: with no block where both
// conditions have a result there is nothing to average either.
func TestNoPairPrintsNeitherMeanNorInterval(t *testing.T) {
	var out bytes.Buffer
	writePairs(&out, []Pair{{"seed", "file-warm: prefetch on minus off", PairedInterval(nil)}})
	if got := fieldsOfLine(out.String(), "file-warm"); got != "seed file-warm: prefetch on minus off - n=0, no interval" {
		t.Errorf("printed %q", got)
	}
}
