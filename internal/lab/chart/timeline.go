package chart

import (
	"fmt"
	"image/color"
	"sort"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"warmstart/internal/memdev"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
)

// Series names of the timeline picture.
const (
	SeriesPrefetch      = "prefetch MiB"
	SeriesDemand        = "demand MiB"
	SeriesDeviceAcquire = "device acquired"
	SeriesVMStarted     = "VM started"
	SeriesReady         = "ready"
)

// Timeline draws one restore: the MiB prefetch and demand requests brought
// in over time (milliseconds from the restore call), each demand request a
// point, and vertical lines, each in its own colour and labelled where it
// stands, where the device was acquired, the VM started and the guest
// became ready.
func Timeline(path string, t restore.Timings, events []startupset.Event, r startupset.Report) error {
	if err := CheckPath(path); err != nil {
		return err
	}
	p := newPlot("", "time since the restore call (ms)", "MiB brought in")
	top := 1.0 // MiB: the height of the phase marks
	for _, s := range []struct {
		name  string
		kind  memdev.Kind
		color color.Color
	}{
		{SeriesPrefetch, memdev.Prefetch, color.RGBA{R: 70, G: 110, B: 180, A: 255}},
		{SeriesDemand, memdev.Demand, color.RGBA{R: 200, G: 60, A: 255}},
	} {
		pts := cumulativeOf(events, s.kind)
		top = max(top, pts[len(pts)-1].Y)
		if err := addCumulative(p, s.name, pts, s.color); err != nil {
			return err
		}
	}
	end := max(ms(t.Ready), 1)
	for i, m := range []struct {
		name string
		at   time.Duration
		c    color.Color
	}{
		{SeriesDeviceAcquire, t.DeviceAcquired, color.RGBA{R: 120, G: 60, B: 170, A: 255}},
		{SeriesVMStarted, t.VMStarted, color.RGBA{R: 20, G: 140, B: 70, A: 255}},
		{SeriesReady, t.Ready, color.Black},
	} {
		// Staggered heights keep labels of marks close in time apart.
		if err := addMark(p, m.name, m.at, top, top*(1.22-0.08*float64(i)), m.at > t.Ready/2, m.c); err != nil {
			return err
		}
	}
	p.X.Min, p.Y.Min = 0, 0
	p.X.Max, p.Y.Max = end*1.02, top*1.28
	title := "restore timeline\n" + startupset.Line(r)
	return save(path, TimelineWidth, TimelineHeight, title, [][]*plot.Plot{{p}})
}

// cumulativeOf is the cumulative MiB of events of kind, in time order.
func cumulativeOf(events []startupset.Event, kind memdev.Kind) plotter.XYs {
	var es []startupset.Event
	for _, e := range events {
		if e.Kind == kind {
			es = append(es, e)
		}
	}
	sort.Slice(es, func(i, j int) bool { return es[i].At < es[j].At })
	pts := make(plotter.XYs, 0, len(es)+1)
	pts = append(pts, plotter.XY{})
	total := 0
	for _, e := range es {
		total += e.Length
		pts = append(pts, plotter.XY{X: ms(e.At), Y: float64(total) / (1 << 20)})
	}
	return pts
}

func addCumulative(p *plot.Plot, name string, pts plotter.XYs, c color.Color) error {
	lp, sp, err := plotter.NewLinePoints(pts)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	lp.Color, sp.Color, sp.Radius = c, c, vg.Points(1.2)
	p.Add(lp, sp)
	p.Legend.Add(name, lp, sp)
	return nil
}

// addMark draws a vertical line at at, from 0 to top, in colour c, and
// labels it at height labelY with its name and time: to the right of the
// line, or to its left when toLeft (a mark near the right edge).
func addMark(p *plot.Plot, name string, at time.Duration, top, labelY float64, toLeft bool, c color.Color) error {
	l, err := plotter.NewLine(plotter.XYs{{X: ms(at), Y: 0}, {X: ms(at), Y: labelY}})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	l.Color, l.Width = c, vg.Points(1.5)
	l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	labels, err := plotter.NewLabels(plotter.XYLabels{
		XYs:    plotter.XYs{{X: ms(at), Y: labelY}},
		Labels: []string{fmt.Sprintf("%s %.1f ms", name, ms(at))},
	})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	sty := &labels.TextStyle[0]
	sty.Color, sty.YAlign = c, draw.YTop
	sty.Font.Size = vg.Points(10)
	labels.Offset = vg.Point{X: vg.Points(3)}
	if toLeft {
		sty.XAlign, labels.Offset.X = draw.XRight, -vg.Points(3)
	}
	p.Add(l, labels)
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
