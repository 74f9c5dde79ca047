package startupset

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
)

// Line is the startup-set outcome as one line a person reads, e.g.
// "startup set 40.0 MiB: 96 % in time, 3 % late, 1 % unused; 0.4 MiB
// missed; prefetch ended 12 ms before ready".
func Line(r Report) string {
	var b strings.Builder
	if r.StartupSetPages == 0 {
		b.WriteString("no startup set")
	} else {
		pct := func(n int64) float64 { return 100 * float64(n) / float64(r.StartupSetPages) }
		fmt.Fprintf(&b, "startup set %s: %.0f %% in time, %.0f %% late, %.0f %% unused",
			mib(r.StartupSetBytes), pct(r.InTimePages), pct(r.LatePages), pct(r.UnusedPages))
	}
	fmt.Fprintf(&b, "; %s missed", mib(r.MissedBytes))
	b.WriteString("; " + prefetchEnd(r))
	return b.String()
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// prefetchEnd says when prefetch ended relative to ready.
func prefetchEnd(r Report) string {
	switch {
	case !r.PrefetchRan:
		return "no prefetch"
	case r.PrefetchEndedBeforeReady == nil:
		return "prefetch still running at ready"
	}
	ms := float64(*r.PrefetchEndedBeforeReady) / 1e6
	if ms < 0 {
		// The task ended while the guest's ready answer was on its way.
		return fmt.Sprintf("prefetch ended %.0f ms after ready", math.Abs(ms))
	}
	return fmt.Sprintf("prefetch ended %.0f ms before ready", ms)
}

// LogValue makes a Report one group of numbers in a structured log line.
func (r Report) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.Int64("bytes", r.StartupSetBytes), slog.Int64("pages", r.StartupSetPages),
		slog.Int64("in_time", r.InTimePages), slog.Int64("late", r.LatePages), slog.Int64("unused", r.UnusedPages),
		slog.Int64("missed", r.MissedPages),
		slog.Int64("demand_requests", r.DemandRequests), slog.Int64("demand_bytes", r.DemandBytes),
		slog.Int64("prefetch_requests", r.PrefetchRequests), slog.Int64("prefetch_bytes", r.PrefetchBytes),
	}
	if d := r.PrefetchEndedBeforeReady; d != nil {
		attrs = append(attrs, slog.Duration("prefetch_ended_before_ready", *d))
	}
	return slog.GroupValue(attrs...)
}
