package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// pauseGoals are issue 31's goals the table checks, each against the
// median of its row.
const (
	goalPauseMs     = 1000 // pause → child published, 256 MiB guest, 16 MiB changed
	goalStoredRatio = 1.10 // child bytes / bytes differing from the parent
	goalResumeRatio = 1.30 // file-cold resume / hot control
	goalDepthRatio  = 1.10 // depth-N chain / flattened copy, file-cold
)

// dominantShare is the share of the pause's time past which one step is
// named as where it goes.
const dominantShare = 0.5

// tableRow prints one row: median, minimum, maximum and count of xs,
// ratios as ratios and times in unit; with a goal (a bound on the median)
// whether it holds.
type tableRow struct {
	w    io.Writer
	unit string // "" for a ratio
}

func (t tableRow) print(name string, xs []float64, goal float64) {
	st := Summarize(xs)
	cell := func(v float64) string {
		if t.unit == "" {
			return fmt.Sprintf("%10.3f", v)
		}
		return fmt.Sprintf("%8.0f%s", v, t.unit)
	}
	goalText, holds := "", ""
	if goal > 0 {
		goalText = fmt.Sprintf("≤ %.2f", goal)
		if t.unit != "" {
			goalText = fmt.Sprintf("≤ %.0f %s", goal, t.unit)
		}
		holds = "no"
		if st.N > 0 && st.Median <= goal {
			holds = "yes"
		}
	}
	line := fmt.Sprintf("%-34s %s %s %s %4d  %-10s %s", name, cell(st.Median), cell(st.Min), cell(st.Max), st.N, goalText, holds)
	fmt.Fprintln(t.w, strings.TrimRight(line, " "))
}

// column is f of every sample.
func column[S any](samples []S, f func(S) float64) []float64 {
	xs := make([]float64, len(samples))
	for i, s := range samples {
		xs[i] = f(s)
	}
	return xs
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// WriteTable prints the run: correctness, then each row's median with
// its range, its goal and whether the median meets it.
func (r *PauseReport) WriteTable(w io.Writer) {
	trials := 0
	if r.Resume != nil {
		trials = len(r.Resume.Trials)
	}
	fmt.Fprintf(w, "pause/resume: qemu %s, %d MiB guest, %d MiB written per cycle, %d cycles, %d resume trials, load %s → %s\n",
		r.Accel, r.MemoryMiB, r.WriteMiB, len(r.Samples), trials, r.LoadBefore, r.LoadAfter)
	verify := "chain verify ok"
	if !r.ChainVerified {
		verify = "chain not verified"
	}
	fmt.Fprintf(w, "%d/%d cycles correct, %s\n", r.CyclesCorrect, len(r.Samples), verify)
	fmt.Fprintf(w, "%-34s %10s %10s %10s %4s  %-10s %s\n", "", "median", "min", "max", "n", "goal", "holds")
	r.writePauseRows(w)
	if r.Resume != nil {
		r.Resume.writeRows(w)
	}
	r.writeDominant(w)
}

func (r *PauseReport) writePauseRows(w io.Writer) {
	times, ratios := tableRow{w, "ms"}, tableRow{w, ""}
	col := func(f func(PauseSample) float64) []float64 { return column(r.Samples, f) }
	times.print("VM paused", col(func(s PauseSample) float64 { return ms(s.Timings.Paused) }), 0)
	times.print("  device state + changed pages", col(func(s PauseSample) float64 { return ms(s.Timings.Freeze) }), 0)
	times.print("  build layer (VM running)", col(func(s PauseSample) float64 { return ms(s.Timings.Layer) }), 0)
	times.print("  publish (VM running)", col(func(s PauseSample) float64 { return ms(s.Timings.Publish) }), 0)
	times.print("pause → child published", col(func(s PauseSample) float64 { return ms(s.Timings.Total) }), goalPauseMs)
	ratios.print("child bytes / written bytes", col(func(s PauseSample) float64 {
		return float64(s.StoredBytes) / float64(max(s.WrittenBytes, 1))
	}), 0)
	ratios.print("child bytes / differing bytes", col(func(s PauseSample) float64 {
		return float64(s.StoredBytes) / float64(max(s.DifferingBytes(), 1))
	}), goalStoredRatio)
	times.print("resume: restore of parent to ready", col(func(s PauseSample) float64 { return ms(s.ResumeNs) }), 0)
}

func (r *ResumeReport) writeRows(w io.Writer) {
	fmt.Fprintf(w, "resume of the last child (depth %d, prefetch %s, harvested manifest unless named):\n", r.Depth, r.Policy)
	times, ratios := tableRow{w, "ms"}, tableRow{w, ""}
	col := func(f func(ResumeTrial) float64) []float64 { return column(r.Trials, f) }
	times.print("  file-cold", col(func(t ResumeTrial) float64 { return ms(t.Cold) }), 0)
	times.print("  hot control", col(func(t ResumeTrial) float64 { return ms(t.Hot) }), 0)
	times.print("  file-warm", col(func(t ResumeTrial) float64 { return ms(t.Warm) }), 0)
	times.print(fmt.Sprintf("  flattened (depth %d), file-cold", r.FlatDepth), col(func(t ResumeTrial) float64 { return ms(t.Flat) }), 0)
	times.print("  recorded manifest, file-cold", col(func(t ResumeTrial) float64 { return ms(t.Recorded) }), 0)
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(max(b, 1)) }
	ratios.print("  file-cold / hot", col(func(t ResumeTrial) float64 { return ratio(t.Cold, t.Hot) }), goalResumeRatio)
	ratios.print("  file-warm / hot", col(func(t ResumeTrial) float64 { return ratio(t.Warm, t.Hot) }), 0)
	ratios.print(fmt.Sprintf("  depth %d / flattened, file-cold", r.Depth), col(func(t ResumeTrial) float64 { return ratio(t.Cold, t.Flat) }), goalDepthRatio)
	ratios.print("  harvested / recorded, file-cold", col(func(t ResumeTrial) float64 { return ratio(t.Cold, t.Recorded) }), 0)
	fmt.Fprintf(w, "manifests: harvested %d pages (%.1f MiB, %d ranges), recorded %d pages (%.1f MiB, %d ranges), %d in common, Jaccard %.3f; %d restores not admitted, made again\n",
		r.Harvested.Pages, mib(r.Harvested.Bytes), r.Harvested.Ranges, r.Recorded.Pages, mib(r.Recorded.Bytes), r.Recorded.Ranges,
		r.CommonPages, r.Jaccard, r.Rejected)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// writeDominant names the step of the pause that takes most of its time
// (by medians), when one takes more than dominantShare of it.
func (r *PauseReport) writeDominant(w io.Writer) {
	total := Summarize(column(r.Samples, func(s PauseSample) float64 { return ms(s.Timings.Total) })).Median
	steps := []struct {
		name string
		f    func(PauseSample) float64
	}{
		{"saving device state and changed pages (VM paused)", func(s PauseSample) float64 { return ms(s.Timings.Freeze) }},
		{"building the layer", func(s PauseSample) float64 { return ms(s.Timings.Layer) }},
		{"publishing", func(s PauseSample) float64 { return ms(s.Timings.Publish) }},
	}
	for _, st := range steps {
		m := Summarize(column(r.Samples, st.f)).Median
		if total > 0 && m > dominantShare*total {
			fmt.Fprintf(w, "the pause goes mostly to %s: median %.0f ms of %.0f ms (%.0f%%)\n", st.name, m, total, 100*m/total)
		}
	}
}
