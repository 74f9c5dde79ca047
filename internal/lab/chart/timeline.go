package chart

import (
	"fmt"
	"image/color"
	"sort"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

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
// point, and vertical lines where the device was acquired, the VM started
// and the guest became ready.
func Timeline(path string, t restore.Timings, events []startupset.Event, r startupset.Report) error {
	if err := CheckPath(path); err != nil {
		return err
	}
	title := fmt.Sprintf("restore timeline: %s", startupset.Line(r))
	p := newPlot(title, "time since the restore call (ms)", "MiB brought in")
	p.Title.TextStyle.Font.Size = vg.Points(9)
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
	for _, m := range []struct {
		name string
		at   time.Duration
		gray uint8
	}{
		{SeriesDeviceAcquire, t.DeviceAcquired, 160}, {SeriesVMStarted, t.VMStarted, 100}, {SeriesReady, t.Ready, 0},
	} {
		if err := addMark(p, m.name, m.at, top, color.Gray{Y: m.gray}); err != nil {
			return err
		}
	}
	p.X.Min, p.Y.Min = 0, 0
	return save(path, TimelineWidth, TimelineHeight, [][]*plot.Plot{{p}})
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

// addMark draws a vertical line at at, from 0 to top.
func addMark(p *plot.Plot, name string, at time.Duration, top float64, c color.Color) error {
	l, err := plotter.NewLine(plotter.XYs{{X: ms(at), Y: 0}, {X: ms(at), Y: top}})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	l.Color, l.Width = c, vg.Points(1.5)
	l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	p.Add(l)
	p.Legend.Add(fmt.Sprintf("%s %.1f ms", name, ms(at)), l)
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
