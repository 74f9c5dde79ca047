package s3bench

import (
	"fmt"
	"io"
)

// The S3 goals are a cold node's time to ready over the link's floor: the
// store's latency plus the startup pack's stored bytes at the node's link
// rate, what no node can beat on that link however it fetches
// (docs/benchmarks.md, "how to read a figure").

// FloorRatio is a cold condition's time to ready over the link's floor.
// Ratios carry no unit, so the JSON has them as plain numbers.
type FloorRatio struct {
	Mean   float64 `json:"mean"`
	Median float64 `json:"median"`
}

// linkFloorMs is the floor in milliseconds: the latency added to a
// response plus the startup pack at the link's rate; 0 (no floor) without
// a startup pack or a link rate.
func linkFloorMs(o Options, s Storage) float64 {
	if s.StartupSetStoredBytes <= 0 || o.LinkBits <= 0 {
		return 0
	}
	transfer := float64(s.StartupSetStoredBytes) * 8 / float64(o.LinkBits) * 1000
	return float64(o.LatencyMs) + transfer
}

// overFloor sets the floor on r and each cold condition's mean and median
// time to ready over it. A warm node fetches nothing before ready, so the
// floor does not bound it and its summary has no ratio.
func (r *Report) overFloor() {
	r.LinkFloorMs = linkFloorMs(r.Options, r.Storage)
	if r.LinkFloorMs <= 0 {
		return
	}
	for i := range r.Summary {
		s := &r.Summary[i]
		if s.Condition.Cache != CacheCold || s.Ready.N == 0 {
			continue
		}
		s.OverLinkFloor = &FloorRatio{Mean: s.Ready.Mean / r.LinkFloorMs, Median: s.Ready.Median / r.LinkFloorMs}
	}
}

// writeFloor prints the floor and each cold condition over it.
func (r *Report) writeFloor(w io.Writer) {
	if r.LinkFloorMs <= 0 {
		fmt.Fprintln(w, "link's floor: none (no startup pack or no link rate)")
		return
	}
	fmt.Fprintf(w, "link's floor: %d ms latency + %.1f MiB startup pack at %d Mbit/s = %.1f ms\n",
		r.Options.LatencyMs, mib(uint64(r.StartupSetStoredBytes)), r.Options.LinkBits/1_000_000, r.LinkFloorMs)
	for _, s := range r.Summary {
		if f := s.OverLinkFloor; f != nil {
			fmt.Fprintf(w, "%s over the link's floor: mean %.2fx (%.1f ms), median %.2fx (%.1f ms)\n",
				s.Condition, f.Mean, s.Ready.Mean, f.Median, s.Ready.Median)
		}
	}
}
