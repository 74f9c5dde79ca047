package s3bench

import (
	"fmt"

	"gonum.org/v1/plot/vg"

	"warmstart/internal/lab/chart"
)

// Size of the S3 bench picture.
const (
	PlotWidth  = 10 * vg.Inch
	PlotHeight = 7 * vg.Inch
)

// Series names in the picture's legends.
const (
	SeriesTrials  = "trials"
	SeriesFetched = "MiB fetched"
)

// Plot draws r to path (SVG or PNG): one column per node cache state
// (cold, warm), the time to ready of every trial with prefetch off and on
// with the mean and median marked, and below it the MiB each restore
// fetched from the object store before ready. Panels of a row share their
// y axis.
func (r *Report) Plot(path string) error {
	columns := []string{PrefetchOff, PrefetchOn}
	var top, bottom []*chart.ColumnPanel
	for _, cache := range []string{CacheCold, CacheWarm} {
		trials := r.trialsOf(cache)
		if len(trials) == 0 {
			continue
		}
		top = append(top, &chart.ColumnPanel{
			Title:  fmt.Sprintf("%s node cache", cache),
			YLabel: "time to ready (ms)", Series: SeriesTrials, Summaries: true,
			Samples: byPrefetch(columns, trials, func(t Trial) float64 { return t.ReadyMs }),
		})
		bottom = append(bottom, &chart.ColumnPanel{
			XLabel: "prefetch", YLabel: "fetched before ready (MiB)", Series: SeriesFetched, Marks: chart.Triangles,
			Samples: byPrefetch(columns, trials, func(t Trial) float64 { return mib(t.BytesToReady) }),
		})
	}
	if len(top) == 0 {
		return fmt.Errorf("s3 bench picture %s: no trial to draw", path)
	}
	o := r.Options
	title := fmt.Sprintf("warmstart S3 bench: %d MiB reference, %d blocks, seed %d, %d ms latency, %d Mbit/s per connection, policy %s",
		o.MemoryBytes>>20, o.Blocks, o.Seed, o.LatencyMs, o.BandwidthBits/1_000_000, o.Policy)
	return chart.Columns(path, PlotWidth, PlotHeight, title, columns, [][]*chart.ColumnPanel{top, bottom})
}

// trialsOf are r's trials with the node cache in state cache.
func (r *Report) trialsOf(cache string) []Trial {
	var out []Trial
	for _, t := range r.Trials {
		if t.Condition.Cache == cache {
			out = append(out, t)
		}
	}
	return out
}

// byPrefetch is value(t) of the trials in each prefetch column.
func byPrefetch(columns []string, trials []Trial, value func(Trial) float64) [][]float64 {
	per := make([][]float64, len(columns))
	for _, t := range trials {
		for i, c := range columns {
			if c == t.Condition.Prefetch {
				per[i] = append(per[i], value(t))
			}
		}
	}
	return per
}
