package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
)

// manifestInspectRanges is how many ranges inspect lists without --verbose.
const manifestInspectRanges = 20

// manifestReport is inspect's JSON output.
type manifestReport struct {
	File       string           `json:"file"`
	Version    int              `json:"version"`
	Size       int64            `json:"size"`
	SHA256     string           `json:"sha256"`
	Layout     layout.Layout    `json:"layout"`
	RangeCount int              `json:"range_count"`
	TotalBytes int64            `json:"total_bytes"`
	Ranges     []manifest.Range `json:"ranges"`
}

// Manifest prints `manifest inspect`: the manifest at path (data, which
// decodes to m), as JSON or for people.
func Manifest(w io.Writer, path string, data []byte, m *manifest.Manifest, asJSON, verbose bool) error {
	if asJSON {
		return manifestJSON(w, path, data, m)
	}
	return manifestText(w, path, data, m, verbose)
}

// manifestJSON prints `manifest inspect --json`.
func manifestJSON(w io.Writer, path string, data []byte, m *manifest.Manifest) error {
	d := manifest.Describe(data)
	ranges := m.Ranges
	if ranges == nil {
		ranges = []manifest.Range{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(manifestReport{
		File: path, Version: manifest.Version, Size: d.Size, SHA256: d.SHA256, Layout: m.Layout,
		RangeCount: len(m.Ranges), TotalBytes: m.TotalBytes(), Ranges: ranges,
	})
}

// manifestText prints `manifest inspect` for people: the header, then the
// first ranges (all of them when verbose).
func manifestText(w io.Writer, path string, data []byte, m *manifest.Manifest, verbose bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	d := manifest.Describe(data)
	fmt.Fprintf(tw, "file\t%s\n", path)
	fmt.Fprintf(tw, "version\t%d\n", manifest.Version)
	fmt.Fprintf(tw, "size\t%d bytes\n", d.Size)
	fmt.Fprintf(tw, "sha256\t%s\n", d.SHA256)
	fmt.Fprintf(tw, "memory file\t%d bytes (%s)\n", m.Layout.FileSize, mibString(m.Layout.FileSize))
	for i, r := range m.Layout.Regions {
		fmt.Fprintf(tw, "region %d\toffset %d, size %d (%s), page size %d\n", i, r.Offset, r.Size, mibString(r.Size), r.PageSize)
	}
	fmt.Fprintf(tw, "ranges\t%d\n", len(m.Ranges))
	fmt.Fprintf(tw, "total\t%d bytes (%s)\n", m.TotalBytes(), mibString(m.TotalBytes()))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(m.Ranges) == 0 {
		return nil
	}
	shown := m.Ranges
	if !verbose && len(shown) > manifestInspectRanges {
		shown = shown[:manifestInspectRanges]
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "#\toffset\tlength\tend\t")
	for i, r := range shown {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t\n", i, r.Offset, r.Length, r.End())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if more := len(m.Ranges) - len(shown); more > 0 {
		_, err := fmt.Fprintf(w, "… %d more (--verbose lists all)\n", more)
		return err
	}
	return nil
}

func mibString(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }

// Attached prints, on w, that the startup manifest recorded after an
// import was attached, and what it holds.
func Attached(w io.Writer, id string, res recorder.Result) {
	fmt.Fprintf(w, "attached startup manifest to %s: sha256 %s, %d ranges, %.1f MiB, ready after %v; %s\n",
		id, res.Descriptor.SHA256, res.Ranges, float64(res.Bytes)/(1<<20), res.ReadyAfter, RecordingLine(res.Recording, res.Fallback))
}

// Recorded reports a startup manifest recorded and attached, and how its
// runs agreed.
func Recorded(w io.Writer, res recorder.Result) error {
	_, err := fmt.Fprintf(w, "attached startup manifest to %s: sha256 %s, %d bytes encoded, %d ranges, %.1f MiB, %d touches, ready after %v\n  %s\n",
		res.SnapshotID, res.Descriptor.SHA256, res.Descriptor.Size, res.Ranges, float64(res.Bytes)/(1<<20), res.Touches, res.ReadyAfter,
		RecordingLine(res.Recording, res.Fallback))
	return err
}

// RecordingLine says how a manifest was recorded: from one run, or from
// the pages two runs both touched and how much they agreed.
func RecordingLine(r repository.Recording, fallback string) string {
	var b strings.Builder
	if r.Runs >= 2 {
		b.WriteString("pages both of 2 recording runs touched")
	} else {
		b.WriteString("pages of 1 recording run")
	}
	if r.Overlap != nil {
		fmt.Fprintf(&b, "; runs overlap %.3f", *r.Overlap)
	}
	if r.RankCorrelation != nil {
		fmt.Fprintf(&b, ", rank correlation %.3f", *r.RankCorrelation)
	}
	if fallback != "" {
		fmt.Fprintf(&b, " (%s)", fallback)
	}
	return b.String()
}
