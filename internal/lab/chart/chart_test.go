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
		{XLabel: "prefetch", YLabel: "MiB", Series: "MiB read", Samples: samples(200), Marks: Triangles, LegendLeft: true},
		{XLabel: "prefetch", YLabel: "MiB", Series: "MiB read", Samples: samples(250), Marks: Triangles, LegendLeft: true},
	}
	w, h := 11*vg.Inch, 7*vg.Inch
	base := drawBoth(t, func(p string) error { return Columns(p, w, h, columns, [][]*ColumnPanel{top, bottom}) })
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
