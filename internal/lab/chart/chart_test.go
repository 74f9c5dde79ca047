package chart

import (
	"encoding/xml"
	"errors"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
)

// svgPicture is what a test reads back from an SVG file: its size in
// points and every text it draws.
type svgPicture struct {
	width, height string
	texts         []string
}

func readSVG(t *testing.T, path string) svgPicture {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	var pic svgPicture
	inText := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed SVG: %v", path, err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if el.Name.Local == "svg" && pic.width == "" {
				for _, a := range el.Attr {
					switch a.Name.Local {
					case "width":
						pic.width = a.Value
					case "height":
						pic.height = a.Value
					}
				}
			}
			inText = el.Name.Local == "text"
		case xml.CharData:
			if inText {
				pic.texts = append(pic.texts, string(el))
			}
		case xml.EndElement:
			inText = false
		}
	}
	return pic
}

// checkPictures checks the SVG at base.svg and the PNG at base.png: the
// stated size, and in the SVG every expected series name.
func checkPictures(t *testing.T, base string, w, h vg.Length, series ...string) {
	t.Helper()
	pic := readSVG(t, base+".svg")
	if want := []string{pt(w), pt(h)}; pic.width != want[0] || pic.height != want[1] {
		t.Errorf("SVG is %s × %s, want %s × %s", pic.width, pic.height, want[0], want[1])
	}
	all := strings.Join(pic.texts, "\n")
	for _, s := range series {
		if !strings.Contains(all, s) {
			t.Errorf("SVG has no %q among its texts:\n%s", s, all)
		}
	}
	f, err := os.Open(base + ".png")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("PNG does not decode: %v", err)
	}
	wantW, wantH := int(float64(w/vg.Inch)*PNGDPI+0.5), int(float64(h/vg.Inch)*PNGDPI+0.5)
	if b := img.Bounds(); b.Dx() != wantW || b.Dy() != wantH {
		t.Errorf("PNG is %d × %d pixels, want %d × %d", b.Dx(), b.Dy(), wantW, wantH)
	}
}

func pt(l vg.Length) string { return strconv.FormatFloat(l.Points(), 'f', -1, 64) + "pt" }

func drawBoth(t *testing.T, draw func(path string) error) string {
	t.Helper()
	base := filepath.Join(t.TempDir(), "picture")
	for _, ext := range []string{".svg", ".png"} {
		if err := draw(base + ext); err != nil {
			t.Fatal(err)
		}
	}
	return base
}

// TestColumnsPicture: a columns figure names every column under every
// panel, each panel's title and series, the summaries of a panel that
// asks for them and its reference line.
func TestColumnsPicture(t *testing.T) {
	columns := []string{"off", "seed", "warmstart"}
	samples := func(base float64) [][]float64 {
		out := make([][]float64, len(columns))
		for i := range out {
			for j := range 4 {
				out[i] = append(out[i], base-float64(80*i)+float64(5*j))
			}
		}
		return out
	}
	top := []*ColumnPanel{
		{Title: "warm memory file", YLabel: "ms", Series: "trials", Samples: samples(300), Summaries: true, Line: 90, LineName: "hot control"},
		{Title: "cold memory file", YLabel: "ms", Series: "trials", Samples: samples(400), Summaries: true},
	}
	bottom := []*ColumnPanel{
		{XLabel: "prefetch", YLabel: "MiB", Series: "MiB read", Samples: samples(200), Marks: Triangles},
		{XLabel: "prefetch", YLabel: "MiB", Series: "MiB read", Samples: samples(250), Marks: Triangles},
	}
	w, h := 11*vg.Inch, 7*vg.Inch
	base := drawBoth(t, func(p string) error { return Columns(p, w, h, "bench run", columns, [][]*ColumnPanel{top, bottom}) })
	checkPictures(t, base, w, h, "trials", SeriesMean, SeriesMedian, "hot control", "MiB read",
		"warm memory file", "cold memory file", "off", "seed", "warmstart")
}

func TestManifestPicture(t *testing.T) {
	l := layout.Single(8 << 20)
	var offsets []int64
	for _, off := range []int64{3 << 20, 0, 4096, 7 << 20, 1 << 20} {
		for p := range int64(16) {
			offsets = append(offsets, off+p*4096)
		}
	}
	m, err := manifest.Build(l, offsets)
	if err != nil {
		t.Fatal(err)
	}
	base := drawBoth(t, func(p string) error { return Manifest(p, m) })
	checkPictures(t, base, ManifestWidth, ManifestHeight, SeriesMap, SeriesCumulative, "pages touched")
}

func TestTimelinePicture(t *testing.T) {
	ms := time.Millisecond
	events := []startupset.Event{
		{Kind: memdev.Prefetch, Offset: 0, Length: 1 << 20, At: 3 * ms},
		{Kind: memdev.Demand, Offset: 8 << 20, Length: 4096, At: 6 * ms, Took: ms / 10},
		{Kind: memdev.Prefetch, Offset: 1 << 20, Length: 1 << 20, At: 9 * ms},
	}
	timings := restore.Timings{DeviceAcquired: 2 * ms, ManifestValidated: 2 * ms, VMStarted: 4 * ms, Ready: 20 * ms}
	rep := startupset.Account(startupset.Input{StartupSet: []startupset.Range{{Offset: 0, Length: 2 << 20}}, Events: events, Ready: 20 * ms})
	base := drawBoth(t, func(p string) error { return Timeline(p, timings, events, rep) })
	checkPictures(t, base, TimelineWidth, TimelineHeight, SeriesPrefetch, SeriesDemand, SeriesDeviceAcquire, SeriesVMStarted,
		SeriesReady+" 20.0 ms", "startup set 2.0 MiB")
}

func TestUnknownFormatIsRefused(t *testing.T) {
	if err := CheckPath("x.pdf"); !errors.Is(err, ErrFormat) {
		t.Fatalf("CheckPath(x.pdf) = %v", err)
	}
	if err := Manifest(filepath.Join(t.TempDir(), "m.jpeg"), &manifest.Manifest{}); !errors.Is(err, ErrFormat) {
		t.Fatalf("Manifest(.jpeg) = %v", err)
	}
}

// testPanels are a bench-like figure: warm and cold times over three
// columns, the cold ones higher, and the MiB read below.
func testPanels() ([]string, [][]*ColumnPanel) {
	columns := []string{"off", "seed", "warmstart"}
	samples := func(base float64) [][]float64 {
		return [][]float64{{base, base + 5}, {base - 80, base - 70}, {base - 100, base - 90}}
	}
	return columns, [][]*ColumnPanel{
		{
			{Title: "warm", Series: "trials", Samples: samples(300), Summaries: true, Line: 90, LineName: "hot control"},
			{Title: "cold", Series: "trials", Samples: samples(600), Summaries: true},
		},
		{{Series: "MiB read", Samples: samples(200), Marks: Triangles}, {Series: "MiB read", Samples: samples(250), Marks: Triangles}},
	}
}

// Every legend is drawn beside its panel's data area, never on it.
func TestLegendsSitOutsideTheData(t *testing.T) {
	columns, panels := testPanels()
	plots, err := columnPlots(columns, panels)
	if err != nil {
		t.Fatal(err)
	}
	c := draw.New(vgimg.New(5*vg.Inch, 3*vg.Inch))
	for i, row := range plots {
		for j, p := range row {
			area, legArea, leg := splitLegend(p, c)
			if leg == nil {
				t.Fatalf("panel %d,%d: no legend", i, j)
			}
			data := p.DataCanvas(area).Rectangle
			box := leg.Rectangle(legArea)
			if box.Min.X < data.Max.X || box.Max.Y > data.Max.Y+vg.Points(1) {
				t.Errorf("panel %d,%d: legend %v overlaps the data area %v", i, j, box, data)
			}
		}
	}
}

// The panels of a row share one y range, which holds every sample.
func TestPanelsOfARowShareTheirYAxis(t *testing.T) {
	columns, panels := testPanels()
	plots, err := columnPlots(columns, panels)
	if err != nil {
		t.Fatal(err)
	}
	for i, row := range plots {
		for _, p := range row[1:] {
			if p.Y.Min != row[0].Y.Min || p.Y.Max != row[0].Y.Max {
				t.Errorf("row %d: y ranges [%v, %v] and [%v, %v] differ", i, row[0].Y.Min, row[0].Y.Max, p.Y.Min, p.Y.Max)
			}
		}
	}
	if top := plots[0][0].Y.Max; top < 605 {
		t.Errorf("the warm panel's y axis ends at %v, below the cold panel's 605 ms", top)
	}
}

// The memory map has a colour bar: its axis, labelled with the ranks.
func TestManifestPictureHasAColourBar(t *testing.T) {
	m, err := manifest.Build(layout.Single(8<<20), []int64{0, 4096, 8192, 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(t.TempDir(), "m")
	if err := Manifest(base+".svg", m); err != nil {
		t.Fatal(err)
	}
	texts := strings.Join(readSVG(t, base+".svg").texts, "|")
	if !strings.Contains(texts, SeriesMap+" (pages, dark first)") {
		t.Errorf("no colour bar axis among the picture's texts: %s", texts)
	}
}

// Ticks fall on round values and read without needless decimals.
func TestTicksAreRound(t *testing.T) {
	for _, c := range []struct {
		min, max float64
		want     string
	}{
		{0, 600, "0 200 400 600"},
		{0, 480, "0 100 200 300 400"},
		{0, 0.9, "0 0.2 0.4 0.6 0.8"},
		{-3, 12, "0 5 10"},
	} {
		var labels []string
		for _, tk := range (niceTicks{}).Ticks(c.min, c.max) {
			if tk.Label != "" {
				labels = append(labels, tk.Label)
			}
		}
		if got := strings.Join(labels, " "); got != c.want {
			t.Errorf("ticks over [%v, %v]: %q, want %q", c.min, c.max, got, c.want)
		}
	}
}
