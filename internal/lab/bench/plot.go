package bench

import (
	"fmt"

	"gonum.org/v1/plot/vg"

	"warmstart/internal/lab/chart"
)

// Series names in the bench picture's legends, which tests look for (the
// mean and median are chart's).
const (
	SeriesTrials  = "trials"
	SeriesHot     = "hot control"
	SeriesBytesMB = "MiB read"
)

// Size of the bench picture.
const (
	PlotWidth  = 11 * vg.Inch
	PlotHeight = 7 * vg.Inch
)

// Plot draws r to path (SVG or PNG): one column per cache state (warm,
// cold), the time to ready of every admitted trial per prefetch column
// (off, then each policy) with the mean and median marked and the hot
// control as a line, and below it the MiB the device read per trial.
func (r *Report) Plot(path string) error {
	columns := append([]string{PrefetchOff}, r.Options.Policies...)
	hot := hotControl(r.Trials)
	var top, bottom []*chart.ColumnPanel
	for _, cache := range []string{CacheWarm, CacheCold} {
		trials := admittedTrials(r.Trials, cache)
		if len(trials) == 0 {
			continue
		}
		top = append(top, &chart.ColumnPanel{
			Title:  fmt.Sprintf("%s memory file, %s device", cache, r.Options.Device),
			YLabel: "time to ready (ms)", Series: SeriesTrials, Summaries: true, Line: hot, LineName: SeriesHot,
			Samples: byColumn(columns, trials, func(t TrialResult) float64 { return t.ReadyMs }),
		})
		bottom = append(bottom, &chart.ColumnPanel{
			XLabel: "prefetch", YLabel: "device read until ready (MiB)", Series: SeriesBytesMB, Marks: chart.Triangles, LegendLeft: true,
			Samples: byColumn(columns, trials, func(t TrialResult) float64 { return float64(t.DeviceBytes.BytesRead) / (1 << 20) }),
		})
	}
	if len(top) == 0 {
		return fmt.Errorf("bench picture %s: no admitted trial to draw", path)
	}
	return chart.Columns(path, PlotWidth, PlotHeight, columns, [][]*chart.ColumnPanel{top, bottom})
}

func admittedTrials(all []TrialResult, cache string) []TrialResult {
	var out []TrialResult
	for _, t := range all {
		if t.Admitted && t.Err == "" && t.Spec.Condition.Cache == cache {
			out = append(out, t)
		}
	}
	return out
}

// hotControl is the mean time to ready of the hot control trials, or 0.
func hotControl(all []TrialResult) float64 {
	trials := admittedTrials(all, CacheHot)
	if len(trials) == 0 {
		return 0
	}
	sum := 0.0
	for _, t := range trials {
		sum += t.ReadyMs
	}
	return sum / float64(len(trials))
}

// byColumn is value(t) of the trials in each prefetch column.
func byColumn(columns []string, trials []TrialResult, value func(TrialResult) float64) [][]float64 {
	per := make([][]float64, len(columns))
	for _, t := range trials {
		for i, c := range columns {
			if c == t.Spec.Condition.Prefetch {
				per[i] = append(per[i], value(t))
			}
		}
	}
	return per
}
