package chart

import (
	"fmt"
	"image/color"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Series names a columns figure adds to a panel with Summaries.
const (
	SeriesMean   = "mean"
	SeriesMedian = "median"
)

// Marks are how a panel draws its samples.
type Marks int

const (
	// Dots are small blue circles.
	Dots Marks = iota
	// Triangles are orange triangles, for a second quantity below the
	// first.
	Triangles
)

// ColumnPanel is one panel of a columns figure: samples of one quantity
// per named column, every sample a point.
type ColumnPanel struct {
	Title, XLabel, YLabel string
	// Series names the samples in the legend.
	Series string
	// Samples are the values of each column, in the figure's column
	// order.
	Samples [][]float64
	Marks   Marks
	// Summaries marks each column's mean and median.
	Summaries bool
	// Line, when above zero, is a horizontal reference line across all
	// columns, named LineName in the legend.
	Line     float64
	LineName string
	// LegendLeft puts the legend on the left.
	LegendLeft bool
}

// Columns draws panels, in rows, each over the same named columns (the x
// axis lines up across them), to path: a figure of w×h as SVG or PNG.
func Columns(path string, w, h vg.Length, columns []string, panels [][]*ColumnPanel) error {
	if err := CheckPath(path); err != nil {
		return err
	}
	plots := make([][]*plot.Plot, len(panels))
	for i, row := range panels {
		for _, cp := range row {
			p, err := cp.plot(columns)
			if err != nil {
				return err
			}
			plots[i] = append(plots[i], p)
		}
	}
	return save(path, w, h, plots)
}

func (cp *ColumnPanel) plot(columns []string) (*plot.Plot, error) {
	p := newPlot(cp.Title, cp.XLabel, cp.YLabel)
	shape, c, radius := draw.GlyphDrawer(draw.CircleGlyph{}), color.Color(color.RGBA{R: 70, G: 110, B: 180, A: 200}), 2.0
	if cp.Marks == Triangles {
		shape, c, radius = draw.TriangleGlyph{}, color.RGBA{R: 180, G: 110, B: 30, A: 220}, 2.5
	}
	if err := addPoints(p, cp.Series, spread(cp.Samples), shape, c, radius); err != nil {
		return nil, err
	}
	if cp.Summaries {
		if err := addSummaries(p, cp.Samples); err != nil {
			return nil, err
		}
	}
	if cp.Line > 0 {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: cp.Line}, {X: float64(len(columns)) - 0.5, Y: cp.Line}})
		if err != nil {
			return nil, err
		}
		l.Color, l.Dashes = color.Gray{Y: 90}, []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(cp.LineName, l)
	}
	nominal(p, columns)
	p.Legend.Left = cp.LegendLeft
	return p, nil
}

// spread places each column's samples as points at x = the column's
// index, spread a little so equal values stay visible.
func spread(samples [][]float64) plotter.XYs {
	var pts plotter.XYs
	for i, vs := range samples {
		for j, v := range vs {
			jitter := 0.15 * (float64(j%7)/3 - 1)
			pts = append(pts, plotter.XY{X: float64(i) + jitter, Y: v})
		}
	}
	return pts
}

// addSummaries marks each column's mean and median.
func addSummaries(p *plot.Plot, samples [][]float64) error {
	var means, medians plotter.XYs
	for i, vs := range samples {
		if len(vs) > 0 {
			means = append(means, plotter.XY{X: float64(i), Y: mean(vs)})
			medians = append(medians, plotter.XY{X: float64(i), Y: median(vs)})
		}
	}
	if err := addPoints(p, SeriesMean, means, draw.PlusGlyph{}, color.RGBA{R: 200, A: 255}, 6); err != nil {
		return err
	}
	return addPoints(p, SeriesMedian, medians, draw.BoxGlyph{}, color.RGBA{G: 140, A: 255}, 4)
}

// nominal labels the x axis with the columns, the same range in every
// panel so that the columns line up.
func nominal(p *plot.Plot, columns []string) {
	p.NominalX(columns...)
	p.X.Min, p.X.Max = -0.5, float64(len(columns))-0.5
	p.Y.Min = 0
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
