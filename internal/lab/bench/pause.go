package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"warmstart/internal/capture"
	"warmstart/internal/config"
	"warmstart/internal/initramfs"
	"warmstart/internal/lab/workspace"
	"warmstart/internal/layers"
	"warmstart/internal/pause"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/qemu"
)

// PauseOptions are a pause/resume run: a captured QEMU guest restored,
// changed through its agent and paused into a child, Cycles times in a
// row, each cycle restoring the previous cycle's child.
type PauseOptions struct {
	Cycles   int
	WriteMiB int
	// WorkDir holds the run's store, mounts and restores.
	WorkDir        string
	InitramfsCache string
	Agent          string
	Progress       io.Writer
}

// PauseSample is one cycle.
type PauseSample struct {
	Cycle int    `json:"cycle"`
	Child string `json:"child"`
	Depth int    `json:"depth"`
	// Resume is the restore of the previous snapshot to ready (the base's
	// in cycle 0), with its manifest (harvested for children).
	ResumeNs     time.Duration `json:"resume_ns"`
	WrittenBytes int64         `json:"written_bytes"`
	StoredBytes  int64         `json:"stored_bytes"`
	Pages        layers.Counts `json:"pages"`
	Timings      pause.Timings `json:"timings"`
}

// PauseReport is a run's samples and the host's load around it.
type PauseReport struct {
	MemoryMiB  int           `json:"-"` // JSON: memory_bytes (MarshalJSON)
	WriteMiB   int           `json:"-"` // JSON: write_bytes
	Accel      string        `json:"accel"`
	LoadBefore string        `json:"load_before"`
	LoadAfter  string        `json:"load_after"`
	Samples    []PauseSample `json:"samples"`
}

// RunPause runs the pause/resume cycles on a freshly captured guest.
func RunPause(ctx context.Context, d *qemu.Driver, o PauseOptions) (*PauseReport, error) {
	rep := &PauseReport{MemoryMiB: int(d.MemoryBytes() >> 20), WriteMiB: o.WriteMiB, LoadBefore: loadAverage()}
	store, err := posixfs.Open(filepath.Join(o.WorkDir, "store"), posixfs.Options{})
	if err != nil {
		return nil, err
	}
	n, err := workspace.Workspace{Dir: o.WorkDir, Device: config.DeviceFile, VMM: d, Repository: store}.Open(ctx)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	snap, job, err := capture.Publish(ctx, store, n.Recorder, capture.Options{
		Booter:     &capture.QEMU{Driver: d, Initramfs: initramfs.Options{CacheDir: o.InitramfsCache, Agent: o.Agent}},
		StagingDir: store.Root(), RuntimeDir: n.Restorer.RuntimeDir, Progress: o.Progress,
	})
	if err != nil {
		return nil, err
	}
	if _, err := job.Result(); err != nil {
		return nil, err
	}
	rep.Accel = snap.Accel
	parent := snap.Record.ID
	for i := range o.Cycles {
		s, err := pauseCycle(ctx, n.Restorer, store, parent, i, o)
		if err != nil {
			return rep, fmt.Errorf("cycle %d: %w", i, err)
		}
		fmt.Fprintf(o.Progress, "cycle %d: child %s depth %d, paused %v, published after %v\n",
			i, s.Child, s.Depth, s.Timings.Paused.Round(time.Millisecond), s.Timings.Total.Round(time.Millisecond))
		rep.Samples = append(rep.Samples, s)
		parent = s.Child
	}
	rep.LoadAfter = loadAverage()
	return rep, nil
}

// pauseCycle restores parent pausable, has its agent write WriteMiB and
// pauses it into a child (then=stop).
func pauseCycle(ctx context.Context, r *restore.Restorer, store *posixfs.Repo, parent string, i int, o PauseOptions) (PauseSample, error) {
	res, err := store.Resolve(ctx, parent)
	if err != nil {
		return PauseSample{}, err
	}
	inst, err := r.Restore(ctx, restore.SourceOf(res), restore.Options{Pausable: true})
	if err != nil {
		return PauseSample{}, err
	}
	defer inst.Stop(context.Background())
	s := PauseSample{Cycle: i, ResumeNs: inst.Timings.Ready, WrittenBytes: int64(o.WriteMiB) << 20}
	agent, ok := inst.VM().(vmm.StateAgent)
	if !ok {
		return s, fmt.Errorf("VM %T keeps no state", inst.VM())
	}
	// One key, a new seed each cycle: the agent replaces the buffer, so
	// every cycle writes WriteMiB anew and the state stays under its cap.
	if _, err := agent.WriteState(ctx, "bench", int64(o.WriteMiB)<<10, uint64(i+1)); err != nil {
		return s, err
	}
	pr, err := pause.Run(ctx, store, inst, pause.Request{Stop: true}, pause.Options{StagingDir: r.RuntimeDir})
	if err != nil {
		return s, err
	}
	s.Child, s.Depth, s.Pages, s.Timings = pr.Child.ID, pr.Child.Depth(), pr.Pages, pr.Timings
	s.StoredBytes = pr.Pages.Stored * layers.PageBytes
	return s, inst.Stop(ctx)
}

// WriteTable prints the run's medians with their range.
func (r *PauseReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "pause/resume: qemu %s, %d MiB guest, %d MiB written per cycle, %d cycles, load %s → %s\n",
		r.Accel, r.MemoryMiB, r.WriteMiB, len(r.Samples), r.LoadBefore, r.LoadAfter)
	fmt.Fprintf(w, "%-34s %10s %10s %10s %4s  %s\n", "", "median", "min", "max", "n", "goal")
	row := func(name, goal string, f func(PauseSample) float64, unit string) {
		xs := make([]float64, len(r.Samples))
		for i, s := range r.Samples {
			xs[i] = f(s)
		}
		st := Summarize(xs)
		cell := func(v float64) string {
			if unit == "" { // a ratio
				return fmt.Sprintf("%10.3f", v)
			}
			return fmt.Sprintf("%8.0f%s", v, unit)
		}
		fmt.Fprintf(w, "%-34s %s %s %s %4d  %s\n", name, cell(st.Median), cell(st.Min), cell(st.Max), st.N, goal)
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	row("VM paused", "", func(s PauseSample) float64 { return ms(s.Timings.Paused) }, "ms")
	row("  device state + changed pages", "", func(s PauseSample) float64 { return ms(s.Timings.Freeze) }, "ms")
	row("  build layer (VM running)", "", func(s PauseSample) float64 { return ms(s.Timings.Layer) }, "ms")
	row("  publish (VM running)", "", func(s PauseSample) float64 { return ms(s.Timings.Publish) }, "ms")
	row("pause → child published", "≤ 1000 ms", func(s PauseSample) float64 { return ms(s.Timings.Total) }, "ms")
	row("child bytes / written bytes", "≤ 1.10", func(s PauseSample) float64 {
		return float64(s.StoredBytes) / float64(max(s.WrittenBytes, 1))
	}, "")
	row("resume: restore of parent to ready", "", func(s PauseSample) float64 { return ms(s.ResumeNs) }, "ms")
}

type plainPauseReport PauseReport

// MarshalJSON writes the guest's size and each cycle's writes in bytes
// (docs/json.md).
func (r PauseReport) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		plainPauseReport
		MemoryBytes int64 `json:"memory_bytes"`
		WriteBytes  int64 `json:"write_bytes"`
	}{plainPauseReport(r), int64(r.MemoryMiB) << 20, int64(r.WriteMiB) << 20})
}

// Write prints the report as every benchmark does (Emit): the table, or
// with asJSON the JSON on out and the table on progress; with jsonFile
// the JSON also goes to that file.
func (r *PauseReport) Write(out, progress io.Writer, asJSON bool, jsonFile string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return Emit(out, progress, asJSON, jsonFile, r.WriteTable, data)
}

// loadAverage is the host's 1, 5 and 15 minute load averages.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
