package chart

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/palette/moreland"
	"gonum.org/v1/plot/plotter"

	"warmstart/internal/manifest"
)

// Series names of the manifest picture.
const (
	SeriesMap        = "first-touch rank"
	SeriesCumulative = "cumulative startup MiB"
)

// mapPageBytes is the unit of the memory map: one cell per 4 KiB page,
// mapRowBytes of memory per row.
const (
	mapPageBytes = 4096
	mapRowBytes  = 1 << 20
)

// Manifest draws a startup manifest: on the left a map of guest memory,
// one row per MiB, each touched page coloured by its first-touch rank
// (untouched pages white); on the right the cumulative bytes of the
// startup set against the first-touch rank of its ranges.
func Manifest(path string, m *manifest.Manifest) error {
	if err := CheckPath(path); err != nil {
		return err
	}
	if len(m.Ranges) == 0 {
		return fmt.Errorf("manifest picture %s: the manifest has no ranges", path)
	}
	pages := rankedPages(m)
	mp, err := memoryMap(m.Layout.FileSize, pages)
	if err != nil {
		return err
	}
	cp, err := cumulative(m.Ranges)
	if err != nil {
		return err
	}
	return save(path, ManifestWidth, ManifestHeight, [][]*plot.Plot{{mp, cp}})
}

// rankedPages lists the manifest's pages in first-touch order.
func rankedPages(m *manifest.Manifest) []int64 {
	var pages []int64
	for _, r := range m.Ranges {
		for off := r.Offset; off < r.End(); off += mapPageBytes {
			pages = append(pages, off/mapPageBytes)
		}
	}
	return pages
}

// pageGrid is the memory map as a heat map grid: column = page within its
// MiB, row = MiB, value = rank (NaN for untouched).
type pageGrid struct {
	rows, cols int
	rank       []float64
}

func (g pageGrid) Dims() (c, r int)   { return g.cols, g.rows }
func (g pageGrid) Z(c, r int) float64 { return g.rank[r*g.cols+c] }
func (g pageGrid) X(c int) float64    { return float64(c) * mapPageBytes / 1024 }
func (g pageGrid) Y(r int) float64    { return float64(r) }

func memoryMap(fileSize int64, pages []int64) (*plot.Plot, error) {
	cols := mapRowBytes / mapPageBytes
	rows := int((fileSize + mapRowBytes - 1) / mapRowBytes)
	g := pageGrid{rows: rows, cols: cols, rank: make([]float64, rows*cols)}
	for i := range g.rank {
		g.rank[i] = math.NaN()
	}
	for rank, p := range pages {
		if i := int(p); i < len(g.rank) && math.IsNaN(g.rank[i]) {
			g.rank[i] = float64(rank)
		}
	}
	pal := moreland.Kindlmann()
	pal.SetMin(0)
	pal.SetMax(float64(max(len(pages)-1, 1)))
	h := plotter.NewHeatMap(g, pal.Palette(256))
	h.NaN = color.White
	p := newPlot(fmt.Sprintf("guest memory, %d pages touched; colour: %s (dark first)", len(pages), SeriesMap),
		"offset within the MiB (KiB)", "MiB")
	p.Add(h)
	p.Y.Min, p.Y.Max = -0.5, float64(rows)-0.5
	return p, nil
}

// cumulative is the startup set's bytes against the first-touch rank of
// its ranges: steep where large runs are touched, flat where the guest
// jumps between single pages.
func cumulative(ranges []manifest.Range) (*plot.Plot, error) {
	pts := make(plotter.XYs, len(ranges))
	total := int64(0)
	for i, r := range ranges {
		total += r.Length
		pts[i] = plotter.XY{X: float64(i + 1), Y: float64(total) / (1 << 20)}
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	l.Color = color.RGBA{R: 70, G: 110, B: 180, A: 255}
	p := newPlot("startup set by first-touch rank", "first-touch rank (ranges)", "cumulative MiB")
	p.Add(l)
	p.Legend.Add(SeriesCumulative, l)
	p.Y.Min = 0
	return p, nil
}
