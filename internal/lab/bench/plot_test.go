package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/lab/chart"
	"warmstart/internal/memdev"
)

// TestPlotDrawsEveryCacheStateAndColumn: the bench picture has a panel
// per cache state with trials, a column per prefetch policy, the
// summaries, the hot control and the bytes read.
func TestPlotDrawsEveryCacheStateAndColumn(t *testing.T) {
	r := &Report{Options: ReportOptions{Device: "file", Policies: []string{"seed", "warmstart"}}}
	for block := range 4 {
		for _, cache := range []string{CacheWarm, CacheCold} {
			for i, col := range []string{PrefetchOff, "seed", "warmstart"} {
				r.Trials = append(r.Trials, TrialResult{Admitted: true,
					Spec:        TrialSpec{Condition: Condition{Cache: cache, Prefetch: col}},
					ReadyMs:     float64(300 - 80*i + 5*block),
					DeviceBytes: memdev.Counters{BytesRead: uint64(40+10*i) << 20}})
			}
		}
		r.Trials = append(r.Trials, TrialResult{Admitted: true, ReadyMs: 90,
			Spec: TrialSpec{Condition: Condition{Cache: CacheHot, Prefetch: PrefetchOff}}})
	}
	path := filepath.Join(t.TempDir(), "bench.svg")
	if err := r.Plot(path); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{SeriesTrials, chart.SeriesMean, chart.SeriesMedian, SeriesHot, SeriesBytesMB,
		"warm memory file, file device", "cold memory file, file device", ">seed<", ">warmstart<", ">off<"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("the bench picture has no %q", want)
		}
	}
	if err := (&Report{}).Plot(path); err == nil {
		t.Error("a report without admitted trials was drawn")
	}
}
