package report

import (
	"bytes"
	"strings"
	"testing"
	"text/tabwriter"

	"warmstart/internal/repository"
)

// A paused snapshot's show names its parent, its depth and every layer
// of its chain with its owner.
func TestMemoryLinesOfALayeredRecord(t *testing.T) {
	rec := repository.Record{ID: "c", Parent: "p", MemorySize: 8192, MemoryFormat: repository.MemoryFormatLayers,
		MemoryLayers: []repository.LayerDescriptor{
			{Snapshot: "b", Name: "memory", Kind: repository.LayerFull, Size: 8192},
			{Snapshot: "c", Name: "layer-0123456789abcdef", Kind: repository.LayerDiff, Size: 4096,
				PageMap: &repository.PageMapDescriptor{DataPages: 1, ZeroPages: 1}},
		}}
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	memoryLines(tw, rec)
	tw.Flush()
	for _, want := range []string{"parent:", "2 layers (depth 1)", "full memory of b", "diff layer-0123456789abcdef of c", "1 data + 1 zero pages"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("show lacks %q:\n%s", want, b.String())
		}
	}
}
