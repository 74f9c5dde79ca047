package report

import (
	"fmt"
	"io"
	"time"

	"warmstart/internal/api"
)

// Paused prints a published child: what it is, what its layer holds and
// where the pause's time went.
func Paused(w io.Writer, r api.PauseResult) {
	alias := ""
	if r.Alias != "" {
		alias = " (" + r.Alias + ")"
	}
	flat := ""
	switch {
	case r.Flattened:
		flat = " (flattened: the chain's diff layers merged into one over its base)"
	case r.Pages.Stored+r.Pages.Zero == 0:
		// The child shares its parent's layers: its depth is the parent's.
		flat = " (no layer of its own: no page differs from " + r.Parent + "'s)"
	}
	fmt.Fprintf(w, "snapshot %s%s: child of %s, depth %d%s\n", r.Snapshot, alias, r.Parent, r.Depth, flat)
	fmt.Fprintf(w, "pages: %d changed, %d identical to the parent, %d zero, %d stored (%.1f MiB)\n",
		r.Pages.Candidates, r.Pages.Identical, r.Pages.Zero, r.Pages.Stored, float64(r.Pages.Stored)*4096/(1<<20))
	t := r.Timings
	fmt.Fprintf(w, "paused %v (freeze %v), layer %v, publish %v, total %v\n", ms(t.Paused), ms(t.Freeze), ms(t.Layer), ms(t.Publish), ms(t.Total))
	switch {
	case r.StopError != "":
		// The child is published; the restore did not stop cleanly, so
		// its stop report is not a "stopped" line.
		fmt.Fprintf(w, "stop failed after the child was published: %s\n", r.StopError)
	case r.Stop != nil:
		Stopped(w, *r.Stop)
	}
}

func ms(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
