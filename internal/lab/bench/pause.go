package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"warmstart/internal/agentspec"
	"warmstart/internal/capture"
	"warmstart/internal/config"
	"warmstart/internal/initramfs"
	"warmstart/internal/lab/workspace"
	"warmstart/internal/layers"
	"warmstart/internal/node"
	"warmstart/internal/pause"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/snapcheck"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/qemu"
)

// stateKey is the agent's buffer each cycle rewrites.
const stateKey = "bench"

// DefaultResumeTrials is --resume-trials' default.
const DefaultResumeTrials = 6

// ErrWrongState is wrapped when a restored child's agent does not report
// the state its guest wrote before the pause: the pause lost or mixed up
// pages, and the run fails.
var ErrWrongState = errors.New("restored guest holds the wrong state")

// PauseOptions are a pause/resume run: a captured QEMU guest restored,
// changed through its agent and paused into a child, Cycles times in a
// row, each cycle restoring the previous cycle's child; then the last
// child's resume measured ResumeTrials times (pause_resume.go).
type PauseOptions struct {
	Cycles       int
	WriteMiB     int
	ResumeTrials int
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

// DifferingBytes is the bytes of the pages that differ from the parent's:
// the pages the guest wrote less those it wrote back equal.
func (s PauseSample) DifferingBytes() int64 {
	return (s.Pages.Candidates - s.Pages.Identical) * layers.PageBytes
}

// PauseReport is a run's samples and the host's load around it.
type PauseReport struct {
	MemoryMiB  int           `json:"-"` // JSON: memory_bytes (MarshalJSON)
	WriteMiB   int           `json:"-"` // JSON: write_bytes
	Accel      string        `json:"accel"`
	LoadBefore string        `json:"load_before"`
	LoadAfter  string        `json:"load_after"`
	Samples    []PauseSample `json:"samples"`
	// CyclesCorrect counts the children whose restore reported, through
	// its agent, the state written before their pause.
	CyclesCorrect int `json:"cycles_correct"`
	// ChainVerified says snapshot verify of the last child, which walks
	// every layer of its chain, found no problem.
	ChainVerified bool `json:"chain_verified"`
	// Resume is the last child's resume measured (pause_resume.go).
	Resume *ResumeReport `json:"resume,omitempty"`
}

// pauseRun is one RunPause in progress.
type pauseRun struct {
	o     PauseOptions
	rep   *PauseReport
	store *posixfs.Repo
	n     *node.Node
}

// RunPause runs the pause/resume cycles on a freshly captured guest, then
// verifies the last child's chain and measures its resume.
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
	p := &pauseRun{o: o, rep: rep, store: store, n: n}
	base, err := p.capture(ctx, d)
	if err != nil {
		return nil, err
	}
	last, err := p.cycles(ctx, base)
	if err != nil {
		return rep, err
	}
	if err := p.verifyChain(ctx, last); err != nil {
		return rep, err
	}
	if rep.Resume, err = p.resume(ctx, last); err != nil {
		return rep, fmt.Errorf("resume of %s: %w", last, err)
	}
	rep.LoadAfter = loadAverage()
	return rep, nil
}

// capture boots the guest and publishes it; it returns the snapshot's id.
func (p *pauseRun) capture(ctx context.Context, d *qemu.Driver) (string, error) {
	snap, job, err := capture.Publish(ctx, p.store, p.n.Recorder, capture.Options{
		Booter:     &capture.QEMU{Driver: d, Initramfs: initramfs.Options{CacheDir: p.o.InitramfsCache, Agent: p.o.Agent}},
		StagingDir: p.store.Root(), RuntimeDir: p.n.Restorer.RuntimeDir, Progress: p.o.Progress,
	})
	if err != nil {
		return "", err
	}
	if _, err := job.Result(); err != nil {
		return "", err
	}
	p.rep.Accel = snap.Accel
	return snap.Record.ID, nil
}

// cycles runs the pause cycles from base; it returns the last child.
func (p *pauseRun) cycles(ctx context.Context, base string) (string, error) {
	parent := base
	for i := range p.o.Cycles {
		s, err := p.cycle(ctx, parent, i)
		if err != nil {
			return "", fmt.Errorf("cycle %d: %w", i, err)
		}
		fmt.Fprintf(p.o.Progress, "cycle %d: child %s depth %d, paused %v, published after %v\n",
			i, s.Child, s.Depth, s.Timings.Paused.Round(time.Millisecond), s.Timings.Total.Round(time.Millisecond))
		p.rep.Samples = append(p.rep.Samples, s)
		parent = s.Child
	}
	return parent, nil
}

// writeKiB is what the agent writes each cycle.
func (p *pauseRun) writeKiB() int64 { return int64(p.o.WriteMiB) << 10 }

// cycle restores parent pausable, checks that its guest holds what the
// previous cycle wrote, has its agent write WriteMiB anew and pauses it
// into a child (then=stop).
func (p *pauseRun) cycle(ctx context.Context, parent string, i int) (PauseSample, error) {
	res, err := p.store.Resolve(ctx, parent)
	if err != nil {
		return PauseSample{}, err
	}
	r := p.n.Restorer
	inst, err := r.Restore(ctx, restore.SourceOf(res), restore.Options{Pausable: true})
	if err != nil {
		return PauseSample{}, err
	}
	defer inst.Stop(context.Background())
	s := PauseSample{Cycle: i, ResumeNs: inst.Timings.Ready, WrittenBytes: int64(p.o.WriteMiB) << 20}
	if err := checkState(ctx, inst, wantState(i, p.writeKiB())); err != nil {
		return s, fmt.Errorf("restore of %s: %w", parent, err)
	}
	if i > 0 {
		p.rep.CyclesCorrect++ // the previous cycle's child
	}
	if err := writeState(ctx, inst, p.writeKiB(), uint64(i+1)); err != nil {
		return s, err
	}
	pr, err := pause.Run(ctx, p.store, inst, pause.Request{Stop: true}, pause.Options{StagingDir: r.RuntimeDir})
	if err != nil {
		return s, err
	}
	s.Child, s.Depth, s.Pages, s.Timings = pr.Child.ID, pr.Child.Depth(), pr.Pages, pr.Timings
	s.StoredBytes = pr.Pages.Stored * layers.PageBytes
	return s, inst.Stop(ctx)
}

// wantState is what the agent of a restore of cycle i's parent holds:
// nothing in the captured base, else the buffer cycle i-1 wrote (seed i).
func wantState(i int, kib int64) map[string]string {
	if i == 0 {
		return map[string]string{}
	}
	return map[string]string{stateKey: agentspec.StateDigest(kib, uint64(i))}
}

// writeState has the agent replace its buffer with one from seed: every
// cycle writes kib anew and the state stays under the agent's cap.
func writeState(ctx context.Context, inst *restore.Instance, kib int64, seed uint64) error {
	agent, ok := inst.VM().(vmm.StateAgent)
	if !ok {
		return fmt.Errorf("VM %T keeps no state", inst.VM())
	}
	got, err := agent.WriteState(ctx, stateKey, kib, seed)
	if err != nil {
		return err
	}
	if want := agentspec.StateDigest(kib, seed); got != want {
		return fmt.Errorf("%w: the agent read back %s after writing, want %s", ErrWrongState, got, want)
	}
	return nil
}

// checkState reads every buffer the restored guest's agent holds, each
// digested again from guest memory, and compares them with want.
func checkState(ctx context.Context, inst *restore.Instance, want map[string]string) error {
	agent, ok := inst.VM().(vmm.StateAgent)
	if !ok {
		return fmt.Errorf("VM %T keeps no state", inst.VM())
	}
	got, err := agent.State(ctx)
	if err != nil {
		return fmt.Errorf("read the guest's state: %w", err)
	}
	if !maps.Equal(got, want) {
		return fmt.Errorf("%w: agent reports %v, want %v", ErrWrongState, got, want)
	}
	return nil
}

// verifyChain runs snapshot verify on the last child: it reads every
// layer of the chain against its digests and checks the lineage.
func (p *pauseRun) verifyChain(ctx context.Context, id string) error {
	r, err := snapcheck.Verify(ctx, p.store, id, snapcheck.Options{})
	if err != nil {
		return fmt.Errorf("verify %s: %w", id, err)
	}
	if !r.OK {
		var b strings.Builder
		snapcheck.WriteText(&b, r)
		return fmt.Errorf("verify %s found problems:\n%s", id, b.String())
	}
	p.rep.ChainVerified = true
	return nil
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
