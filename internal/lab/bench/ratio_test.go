package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"warmstart/internal/api/apitest"
	"warmstart/internal/config"
)

// concurrentTrial is an admitted trial of c in block whose restores were
// ready after each of ms, read back as the parent reads a trial's report.
func concurrentTrial(t *testing.T, block int, c Condition, ms ...float64) TrialResult {
	t.Helper()
	res := TrialResult{Spec: TrialSpec{Block: block, Condition: c, Concurrency: len(ms)}, Admitted: true, HashOK: true}
	for _, m := range ms {
		d := time.Duration(m * float64(time.Millisecond))
		res.ConcurrentReady = append(res.ConcurrentReady, d)
		res.SlowestReady = max(res.SlowestReady, d)
	}
	data, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	back, err := readResult(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return back
}

// ratioRun is four blocks of file-cold and the hot control with two
// concurrent restores per trial, and file-warm in two blocks:
//
//	block  hot            cold                             cold / hot
//	1      100            100                              1
//	2      40, 100 -> 100 150, 200 -> 200                  2
//	3      missed         500                              (no hot control)
//	4      50             missed, reserve replacement 200  4
//
// file-warm runs in blocks 1 and 3 only: one block with the hot control.
func ratioRun(t *testing.T) (Options, []TrialResult) {
	o := Options{Device: config.DeviceFile, Blocks: 4, Hot: true, Concurrency: 2}
	repl := concurrentTrial(t, 3, coldOff, 200, 120)
	repl.Spec.Reserve = true
	trials := []TrialResult{
		concurrentTrial(t, 0, hotOff, 100, 90), concurrentTrial(t, 0, coldOff, 100, 100),
		concurrentTrial(t, 1, hotOff, 40, 100), concurrentTrial(t, 1, coldOff, 150, 200),
		missedTrial(2, hotOff), concurrentTrial(t, 2, coldOff, 500, 400),
		concurrentTrial(t, 3, hotOff, 50, 50), missedTrial(3, coldOff),
		concurrentTrial(t, 0, warmOff, 120, 110), concurrentTrial(t, 2, warmOff, 300, 300),
		repl,
	}
	return o, trials
}

func TestRatioToHotIsPairedByBlockOverAdmittedSlowestRestores(t *testing.T) {
	o, trials := ratioRun(t)
	s := summarize(o, trials)
	got := cellOf(t, s, coldOff).RatioToHot
	// Ratios 1, 2, 4: logs 0, ln 2, 2 ln 2; their mean ln 2 (geometric
	// mean 2), sample standard deviation ln 2, s.e. ln 2 / sqrt 3, so the
	// factor is exp(2 ln 2 / sqrt 3) = 2^(2/sqrt 3).
	want := HotRatio{GeometricMean: 2, Factor2SE: math.Pow(2, 2/math.Sqrt(3)), Median: 2, Blocks: 3}
	if got == nil || !near(got.GeometricMean, want.GeometricMean) || !near(got.Factor2SE, want.Factor2SE) ||
		!near(got.Median, want.Median) || got.Blocks != want.Blocks {
		t.Fatalf("file-cold ratio to hot %+v, want %+v", got, want)
	}
	if r := cellOf(t, s, warmOff).RatioToHot; r != nil {
		t.Errorf("file-warm shares one block with the hot control; want no ratio, got %+v", r)
	}
	if r := cellOf(t, s, hotOff).RatioToHot; r != nil {
		t.Errorf("the hot control over itself: want no ratio, got %+v", r)
	}
}

func TestRatioToHotAbsentWithoutHotControlOrBlocks(t *testing.T) {
	o := Options{Blocks: 2}
	s := summarize(o, trialsOf(map[Condition][]float64{warmOff: {10, 20}, coldOff: {30, 40}}))
	for _, c := range s.Cells {
		if c.RatioToHot != nil {
			t.Errorf("%v: ratio to hot %+v in a run without the hot control", c.Condition, c.RatioToHot)
		}
	}
	o = Options{Device: config.DeviceFile, Blocks: 1, Hot: true}
	s = summarize(o, trialsOf(map[Condition][]float64{coldOff: {30}, hotOff: {10}}))
	if r := cellOf(t, s, coldOff).RatioToHot; r != nil {
		t.Errorf("one block: want no ratio (no standard error), got %+v", r)
	}
}

func TestRatioOfBlocksRefusesRatiosWithoutALogarithm(t *testing.T) {
	for _, rs := range [][]float64{{1, 0}, {1, math.Inf(1)}, {1, math.NaN()}, {2}} {
		if got := RatioOfBlocks(rs); got != nil {
			t.Errorf("RatioOfBlocks(%v) = %+v, want nil", rs, got)
		}
	}
	if got := RatioOfBlocks([]float64{1, 4}); got == nil || !near(got.GeometricMean, 2) || !near(got.Factor2SE, 4) || !near(got.Median, 2.5) {
		t.Errorf("RatioOfBlocks(1, 4) = %+v, want 2x ×/÷ 4, median 2.5", got)
	}
}

func TestRatioToHotIsPrintedAndInTheJSON(t *testing.T) {
	o, trials := ratioRun(t)
	rep := &Report{Options: ReportOptions{Blocks: 4, Concurrency: 2}, Summary: summarize(o, trials), Trials: trials}
	var out bytes.Buffer
	rep.WriteTable(&out)
	table := out.String()
	_, section, ok := strings.Cut(table, "over the same block's hot control")
	if !ok {
		t.Fatalf("no hot-control table:\n%s", table)
	}
	for row, want := range map[string]string{
		"file-cold": "file-cold 2.00x ×/÷ 2.23 (3)", "file-warm": "file-warm -", "file-hot": "file-hot control",
	} {
		if got := fieldsOfLine(section, row); got != want {
			t.Errorf("hot-control table row %q, want %q:\n%s", got, want, table)
		}
	}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	apitest.CheckConvention(t, "bench report", data)
	var doc struct {
		Summary struct {
			Cells []map[string]json.RawMessage `json:"cells"`
		} `json:"summary"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	for i, c := range rep.Summary.Cells {
		raw, ok := doc.Summary.Cells[i]["ratio_to_hot"]
		if c.RatioToHot == nil {
			if ok {
				t.Errorf("%v: ratio_to_hot %s, want it absent", c.Condition, raw)
			}
			continue
		}
		var got map[string]float64
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("%v: ratio_to_hot %s: %v", c.Condition, raw, err)
		}
		if len(got) != 4 || !near(got["geometric_mean"], 2) || !near(got["factor_2se"], c.RatioToHot.Factor2SE) ||
			got["median"] != 2 || got["blocks"] != 3 {
			t.Errorf("%v: ratio_to_hot %s, want geometric_mean 2, factor_2se %v, median 2, blocks 3",
				c.Condition, raw, c.RatioToHot.Factor2SE)
		}
	}
}
