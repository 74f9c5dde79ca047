package chart

import (
	"fmt"
	"image/color"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"warmstart/internal/bench"
)

// Series names in the bench picture's legends, which tests look for.
const (
	SeriesTrials  = "trials"
	SeriesMean    = "mean"
	SeriesMedian  = "median"
	SeriesHot     = "hot control"
	SeriesBytesMB = "MiB read"
)

// Bench draws a benchmark: one column per cache state (warm, cold), the
// time to ready of every admitted trial per prefetch column (off, then
// each policy) as points with the mean and median marked and the hot
// control as a line, and below it the MiB the device read per trial.
func Bench(path string, r *bench.Report) error {
	if err := CheckPath(path); err != nil {
		return err
	}
	columns := append([]string{bench.PrefetchOff}, r.Options.Policies...)
	hot := hotControl(r.Trials)
	var top, bottom []*plot.Plot
	for _, cache := range []string{bench.CacheWarm, bench.CacheCold} {
		trials := admittedTrials(r.Trials, cache)
		if len(trials) == 0 {
			continue
		}
		title := fmt.Sprintf("%s memory file, %s device", cache, r.Options.Device)
		tp, err := readyPanel(title, columns, trials, hot)
		if err != nil {
			return err
		}
		bp, err := bytesPanel(columns, trials)
		if err != nil {
			return err
		}
		top, bottom = append(top, tp), append(bottom, bp)
	}
	if len(top) == 0 {
		return fmt.Errorf("bench picture %s: no admitted trial to draw", path)
	}
	return save(path, BenchWidth, BenchHeight, [][]*plot.Plot{top, bottom})
}

func admittedTrials(all []bench.TrialResult, cache string) []bench.TrialResult {
	var out []bench.TrialResult
	for _, t := range all {
		if t.Admitted && t.Err == "" && t.Spec.Condition.Cache == cache {
			out = append(out, t)
		}
	}
	return out
}

// hotControl is the mean time to ready of the hot control trials, or 0.
func hotControl(all []bench.TrialResult) float64 {
	var ms []float64
	for _, t := range admittedTrials(all, bench.CacheHot) {
		ms = append(ms, t.ReadyMs)
	}
	if len(ms) == 0 {
		return 0
	}
	return mean(ms)
}

// byColumn gathers value(t) of trials per prefetch column, as points at
// x = the column's index, spread a little so equal values stay visible.
func byColumn(columns []string, trials []bench.TrialResult, value func(bench.TrialResult) float64) (plotter.XYs, [][]float64) {
	var pts plotter.XYs
	per := make([][]float64, len(columns))
	for _, t := range trials {
		i := slices.Index(columns, t.Spec.Condition.Prefetch)
		if i < 0 {
			continue
		}
		jitter := 0.15 * (float64(len(per[i])%7)/3 - 1)
		per[i] = append(per[i], value(t))
		pts = append(pts, plotter.XY{X: float64(i) + jitter, Y: value(t)})
	}
	return pts, per
}

func readyPanel(title string, columns []string, trials []bench.TrialResult, hot float64) (*plot.Plot, error) {
	p := newPlot(title, "", "time to ready (ms)")
	pts, per := byColumn(columns, trials, func(t bench.TrialResult) float64 { return t.ReadyMs })
	if err := addPoints(p, SeriesTrials, pts, draw.CircleGlyph{}, color.RGBA{R: 70, G: 110, B: 180, A: 200}, 2); err != nil {
		return nil, err
	}
	var means, medians plotter.XYs
	for i, vs := range per {
		if len(vs) > 0 {
			means = append(means, plotter.XY{X: float64(i), Y: mean(vs)})
			medians = append(medians, plotter.XY{X: float64(i), Y: median(vs)})
		}
	}
	if err := addPoints(p, SeriesMean, means, draw.PlusGlyph{}, color.RGBA{R: 200, A: 255}, 6); err != nil {
		return nil, err
	}
	if err := addPoints(p, SeriesMedian, medians, draw.BoxGlyph{}, color.RGBA{G: 140, A: 255}, 4); err != nil {
		return nil, err
	}
	if hot > 0 {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: hot}, {X: float64(len(columns)) - 0.5, Y: hot}})
		if err != nil {
			return nil, err
		}
		l.Color, l.Dashes = color.Gray{Y: 90}, []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(SeriesHot, l)
	}
	nominal(p, columns)
	return p, nil
}

// nominal labels the x axis with the prefetch columns, the same range in
// every panel so that the columns line up.
func nominal(p *plot.Plot, columns []string) {
	p.NominalX(columns...)
	p.X.Min, p.X.Max = -0.5, float64(len(columns))-0.5
	p.Y.Min = 0
}

func bytesPanel(columns []string, trials []bench.TrialResult) (*plot.Plot, error) {
	p := newPlot("", "prefetch", "device read until ready (MiB)")
	pts, _ := byColumn(columns, trials, func(t bench.TrialResult) float64 { return float64(t.DeviceBytes.BytesRead) / (1 << 20) })
	if err := addPoints(p, SeriesBytesMB, pts, draw.TriangleGlyph{}, color.RGBA{R: 180, G: 110, B: 30, A: 220}, 2.5); err != nil {
		return nil, err
	}
	nominal(p, columns)
	p.Legend.Left = true
	return p, nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p
}

func addPoints(p *plot.Plot, name string, pts plotter.XYs, shape draw.GlyphDrawer, c color.Color, radius float64) error {
	if len(pts) == 0 {
		return nil
	}
	s, err := plotter.NewScatter(pts)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	s.GlyphStyle = draw.GlyphStyle{Shape: shape, Color: c, Radius: vg.Points(radius)}
	p.Add(s)
	p.Legend.Add(name, s)
	return nil
}

func mean(vs []float64) float64 {
	sum := 0.0
	for _, v := range vs {
		sum += v
	}
	return sum / float64(len(vs))
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
