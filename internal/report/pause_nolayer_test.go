package report

import (
	"bytes"
	"strings"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/layers"
)

// A pause in which no page differs from the parent publishes a child that
// shares its parent's layers: its depth is the parent's (0 over a captured
// snapshot), and the report says why rather than print a bare "depth 0"
// that reads as if no child was made.
func TestPausedWithoutALayerSaysItSharesItsParents(t *testing.T) {
	var b bytes.Buffer
	Paused(&b, api.PauseResult{Snapshot: "kid", Parent: "base", Depth: 0,
		Pages: layers.Counts{Candidates: 3, Identical: 3}})
	out := b.String()
	want := "snapshot kid: child of base, depth 0 (no layer of its own: no page differs from base's)"
	if !strings.Contains(out, want) {
		t.Errorf("report %q does not contain %q", out, want)
	}
	b.Reset()
	Paused(&b, api.PauseResult{Snapshot: "kid", Parent: "base", Depth: 1, Pages: layers.Counts{Candidates: 1, Zero: 1}})
	if out := b.String(); strings.Contains(out, "no layer of its own") {
		t.Errorf("report %q of a child with a zero page says it has no layer", out)
	}
}
