package chart

import (
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// legendGap separates a panel's data area from its legend.
const legendGap = 3 * vg.Millimeter

// drawPanel draws p on c with its legend in a strip to the right of the
// data area, never on the data.
func drawPanel(p *plot.Plot, c draw.Canvas) {
	area, legArea, leg := splitLegend(p, c)
	p.Draw(area)
	if leg != nil {
		leg.Draw(legArea)
	}
}

// splitLegend takes p's legend out of p (so that p draws none) and splits
// c into the area p draws in and, on its right, the strip the legend goes
// in, top-aligned with the data area. A plot without a legend keeps all
// of c.
func splitLegend(p *plot.Plot, c draw.Canvas) (area, legArea draw.Canvas, leg *plot.Legend) {
	l := p.Legend
	width := l.Rectangle(c).Size().X
	if width <= 0 {
		return c, draw.Canvas{}, nil
	}
	p.Legend = plot.NewLegend()
	l.Top, l.Left, l.XOffs, l.YOffs = true, true, 0, 0
	strip := width + 2*legendGap
	area = draw.Crop(c, 0, -strip, 0, 0)
	legArea = draw.Crop(c, c.Size().X-strip+legendGap, 0, 0, 0)
	legArea.Max.Y = p.DataCanvas(area).Max.Y
	return area, legArea, &l
}

// drawTitle writes a figure's title centred along the top of c and
// returns what is left of c below it.
func drawTitle(c draw.Canvas, title string) draw.Canvas {
	if title == "" {
		return c
	}
	sty := plot.New().Title.TextStyle
	sty.Font.Size = vg.Points(12)
	sty.XAlign, sty.YAlign = draw.XCenter, draw.YTop
	c.FillText(sty, vg.Point{X: (c.Min.X + c.Max.X) / 2, Y: c.Max.Y - 2*vg.Millimeter}, title)
	return draw.Crop(c, 0, 0, 0, -(sty.Height(title) + 4*vg.Millimeter))
}

// niceTicks marks an axis at 1, 2 or 5 times a power of ten, labelled
// with no more decimals than the step needs ("250", "0.5", never
// "250.00").
type niceTicks struct{}

// Ticks returns the major ticks over [min, max], about five of them, and
// an unlabelled minor tick between each two.
func (niceTicks) Ticks(min, max float64) []plot.Tick {
	if !(max > min) || math.IsInf(max-min, 0) {
		return []plot.Tick{{Value: min, Label: label(min, 0)}}
	}
	step, decimals := niceStep((max - min) / 5)
	var ticks []plot.Tick
	for v := math.Ceil(min/step) * step; v <= max+step*1e-9; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: label(v, decimals)})
		if minor := v + step/2; minor <= max {
			ticks = append(ticks, plot.Tick{Value: minor})
		}
	}
	return ticks
}

// niceStep is the smallest of 1, 2 and 5 times a power of ten not below
// raw, and the decimals its labels need.
func niceStep(raw float64) (step float64, decimals int) {
	exp := math.Floor(math.Log10(raw))
	mag := math.Pow(10, exp)
	for _, m := range []float64{1, 2, 5, 10} {
		if step = m * mag; step >= raw*(1-1e-9) {
			break
		}
	}
	return step, max(0, -int(math.Floor(math.Log10(step))))
}

// label writes v rounded to decimals decimals, as short as it reads
// ("0", "0.2", "250"), without a negative zero.
func label(v float64, decimals int) string {
	scale := math.Pow(10, float64(decimals))
	r := math.Round(v*scale) / scale
	if r == 0 {
		r = 0 // not -0
	}
	return strconv.FormatFloat(r, 'f', -1, 64)
}
