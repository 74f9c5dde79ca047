// Package chart draws warmstart's pictures with gonum/plot: panels of
// samples over named columns (what the benchmark draws its trials with), a
// startup manifest's memory map and cumulative bytes, and one restore's
// timeline. Each is written as SVG or PNG, chosen by the file name. It
// knows nothing of the benchmark.
package chart

import (
	"errors"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"warmstart/internal/untrusted"
)

// PNGDPI is the resolution of PNG pictures: a picture of W×H inches is
// W·PNGDPI × H·PNGDPI pixels.
const PNGDPI = 96

// Picture sizes.
const (
	ManifestWidth  = 11 * vg.Inch
	ManifestHeight = 5 * vg.Inch
	TimelineWidth  = 9 * vg.Inch
	TimelineHeight = 5 * vg.Inch
)

// ErrFormat rejects a file name that is neither .svg nor .png.
var ErrFormat = errors.New("picture file must end in .svg or .png")

// CheckPath refuses a path whose format is unknown, before any work.
func CheckPath(path string) error {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg", ".png":
	default:
		return fmt.Errorf("%q: %w", path, ErrFormat)
	}
	// The picture is drawn after the work it shows (a whole restore or
	// benchmark); a directory it cannot be written to is refused now.
	return untrusted.CheckCreatable(path)
}

// save lays plots out in rows and columns on a w×h picture at path. The
// file is written whole to a temporary name and renamed, so a reader never
// sees half a picture.
func save(path string, w, h vg.Length, plots [][]*plot.Plot) error {
	if err := CheckPath(path); err != nil {
		return err
	}
	var c vg.CanvasWriterTo
	if strings.EqualFold(filepath.Ext(path), ".svg") {
		c = vgsvg.New(w, h)
	} else {
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(PNGDPI))}
	}
	dc := draw.New(c)
	// A white background: a transparent PNG is unreadable on a dark page.
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	tiles := draw.Tiles{Rows: len(plots), Cols: len(plots[0]), PadX: vg.Centimeter, PadY: vg.Centimeter,
		PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	canvases := plot.Align(plots, tiles, dc)
	for i, row := range plots {
		for j, p := range row {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	return writeFile(path, c)
}

// writeFile writes the picture durably: temp file, fsync, rename, fsync
// the directory.
func writeFile(path string, c vg.CanvasWriterTo) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".picture-*")
	if err != nil {
		return fmt.Errorf("write picture %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			err = fmt.Errorf("write picture %s: %w", path, err)
		}
	}()
	if _, err = c.WriteTo(tmp); err != nil {
		return err
	}
	if err = tmp.Chmod(0o644); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
