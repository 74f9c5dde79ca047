// Package bench is the seed's Experiment 2 measurement protocol, built in:
// blocks of serial restores in a frozen randomized order, each trial in its
// own process and private runtime directory, after an untimed baseline
// restore whose device release is acknowledged; a fresh private copy of the
// memory lower file, fully read and SHA-256-checked, left resident
// (file-warm) or dropped with one POSIX_FADV_DONTNEED (file-cold); a mincore
// admission probe just before the timer; the timer covering device
// acquisition, manifest validation, prefetch, VM restore and readiness.
// Results are paired within blocks and summarized with descriptive 95%
// Student-t intervals. Several prefetch policies can be compared in one run.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/config"
	"warmstart/internal/lab/synth"
	"warmstart/internal/memdev"
	"warmstart/internal/node"
	"warmstart/internal/reexec"
	"warmstart/internal/restore"
	"warmstart/internal/trace"
	"warmstart/internal/vmm/qemu"
	"warmstart/internal/vmm/replay"
)

// Options configure a benchmark run.
type Options struct {
	Source restore.Source
	// VMM is the driver trials restore with: config.DriverReplay (also when empty),
	// which plays TracePath, or config.DriverQEMU, the real guest QEMU configures.
	VMM  string
	QEMU qemu.Options
	// ExpectedToken is the token the real guest captured in Source answers
	// with. When empty, an excluded pilot trial learns it first, and every
	// formal trial must then answer with the same.
	ExpectedToken string
	// ExpectedDigest is the agent's digest of its heap and files, which a
	// guest resumed from intact memory reports unchanged.
	ExpectedDigest string
	TracePath      string
	Device         string
	IOEngine       int
	Blocks         int
	// ReserveBlocks replace trials that miss admission.
	ReserveBlocks int
	Seed          uint64
	// Policies are the prefetch policies compared; each gets a column. A
	// name ending in UnverifiedSuffix (also "off+noverify") restores
	// without checking memory against its digest table.
	Policies []string
	// Hot adds the hot control condition (file device only).
	Hot bool
	// WorkDir holds the trials' private runtime directories.
	WorkDir string
	// Exe is the executable trials run as; this process's when empty.
	Exe      string
	Progress io.Writer
	// Kill, once closed, kills the running trial process at once (a
	// second interrupt) instead of granting it trialStopGrace to stop
	// cleanly after ctx ends. What a killed trial leaves mounted is
	// detached, and its directory removed, all the same.
	Kill <-chan struct{}
	// Drift, above 0, makes every trial play its own drifting variant of
	// the reference trace (synth.Drift) against the base's manifest;
	// Variants are their paths, variant 1 first (UseReference writes
	// VariantCount of them). 0 plays TracePath in every trial.
	Drift    float64
	Variants []string
	// Learn is the number of learning restores each learned column
	// (LearnedSuffix) gets before the formal blocks.
	Learn int
	// Readaround is the windows the trials' file devices mount with
	// (ReadaroundOf the operator's configuration); the zero value is the
	// defaults'.
	Readaround Readaround
	// OnTrial, when set, is handed every trial's result as it ends, with
	// the device events of its timed restore, which the report drops.
	OnTrial func(TrialResult)
}

// trialStopGrace bounds the clean stop of an interrupted trial: its
// restores stopped in the seed's order, its device unmounted. A replay VMM
// stops in milliseconds, a real guest within its stop timeout.
const trialStopGrace = 20 * time.Second

// Report is a whole run: raw trials and the summary.
type Report struct {
	Options ReportOptions `json:"options"`
	Orders  [][]Condition `json:"orders"`
	// Pilot is the excluded trial that learned a real guest's token.
	Pilot    *TrialResult  `json:"pilot,omitempty"`
	Trials   []TrialResult `json:"trials"`
	Replaced []string      `json:"replaced,omitempty"`
	// Learning is what the learning restores of each learned column did.
	Learning []LearnReport `json:"learning,omitempty"`
	Summary  Summary       `json:"summary"`
	Leaks    []string      `json:"leaks,omitempty"`
	Started  time.Time     `json:"started"`
	Elapsed  time.Duration `json:"elapsed_ns"`
}

// ReportOptions is the part of Options worth recording.
type ReportOptions struct {
	Snapshot string   `json:"snapshot"`
	VMM      string   `json:"vmm"`
	Device   string   `json:"device"`
	IOEngine int      `json:"io_engine"`
	Blocks   int      `json:"blocks"`
	Seed     uint64   `json:"seed"`
	Policies []string `json:"policies"`
	Drift    float64  `json:"drift,omitempty"`
	Learn    int      `json:"learn,omitempty"`
	// Readaround is the windows the trials mounted with.
	Readaround Readaround `json:"readaround"`
}

// Conditions returns the conditions of one block.
func (o Options) Conditions() []Condition {
	var cs []Condition
	for _, cache := range []string{CacheWarm, CacheCold} {
		cs = append(cs, Condition{cache, PrefetchOff})
		for _, p := range o.Policies {
			cs = append(cs, Condition{cache, p})
		}
	}
	if o.Hot && o.Device == config.DeviceFile {
		cs = append(cs, Condition{CacheHot, PrefetchOff})
	}
	return cs
}

// Orders freezes the randomized order of every block, reproducibly from
// the seed. Reserve blocks follow the formal ones.
func (o Options) Orders() [][]Condition {
	r := rand.New(rand.NewPCG(o.Seed, 0x9e3779b97f4a7c15))
	orders := make([][]Condition, o.Blocks+o.ReserveBlocks)
	for b := range orders {
		cs := o.Conditions()
		r.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
		orders[b] = cs
	}
	return orders
}

// MaxBlocks bounds --blocks and --reserve-blocks. The orders of every
// block are drawn before the first trial, and a block takes seconds on
// the replay VMM and more on a real guest: a thousand is hours of work,
// and a mistyped count far beyond it would only allocate orders until the
// host ran out of memory.
const MaxBlocks = 1000

// CheckBlocks refuses a block count, given as --flag, outside [least,
// MaxBlocks]: bench, demo and warmstart-s3bench share the bound.
func CheckBlocks(flag string, n, least int) error {
	if n < least || n > MaxBlocks {
		return fmt.Errorf("--%s %d: want %d to %d", flag, n, least, MaxBlocks)
	}
	return nil
}

// Validate checks the options before any work starts.
func (o *Options) Validate() error {
	if err := errors.Join(CheckBlocks("blocks", o.Blocks, 1), CheckBlocks("reserve-blocks", o.ReserveBlocks, 0)); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if o.Device != config.DeviceFile && o.Device != config.DeviceUffd {
		return fmt.Errorf("bench: device %q: want file or uffd", o.Device)
	}
	switch o.VMM {
	case "", config.DriverReplay:
	case config.DriverQEMU:
		if o.Device != config.DeviceFile {
			return fmt.Errorf("bench: the qemu VMM maps its memory from a file: device %q is not available", o.Device)
		}
	default:
		return fmt.Errorf("bench: VMM %q: want %s or %s", o.VMM, config.DriverReplay, config.DriverQEMU)
	}
	if len(o.Policies) == 0 {
		return errors.New("bench: no prefetch policy to compare")
	}
	if err := CheckPolicies(o.Policies); err != nil {
		return fmt.Errorf("bench: --policies: %w", err)
	}
	if o.Source.Manifest == nil {
		return fmt.Errorf("bench: snapshot %s has no startup manifest; record one first (warmstart snapshot record-manifest)", o.Source.SnapshotID)
	}
	if err := o.validateLearn(); err != nil {
		return err
	}
	return o.validateDrift()
}

// validateDrift checks that a drifting run has a variant for every trial
// and a VMM that plays traces.
func (o *Options) validateDrift() error {
	if err := synth.CheckDrift(o.Drift); err != nil {
		return fmt.Errorf("bench: --drift: %w", err)
	}
	switch {
	case o.Drift == 0:
		return nil
	case o.VMM != "" && o.VMM != config.DriverReplay:
		return fmt.Errorf("bench: --drift: the %s VMM drifts by itself; only the replay VMM plays drifting variants", o.VMM)
	case len(o.Variants) < o.VariantCount()+o.LearnVariants():
		return fmt.Errorf("bench: --drift %v: %d variants of the trace for %d trials and %d learning restores",
			o.Drift, len(o.Variants), o.VariantCount(), o.LearnVariants())
	}
	return nil
}

// VariantCount is how many drifting variants a run plays: one per
// condition of every formal and reserve block. Variants numbered above it
// are left for restores outside the protocol's trials (restores that
// teach a manifest, say), so they never replay a timed trial's start-up.
func (o Options) VariantCount() int {
	return (o.Blocks + o.ReserveBlocks) * len(o.Conditions())
}

// TrialTrace picks the startup trace the trial of condition c in block
// plays, and its variant number (0: the base trace). It is the one place
// that decides it. Without drift every trial plays TracePath. With drift
// every trial of every condition plays its own variant, numbered by block
// and the condition's place in Conditions (not the block's shuffled
// order), so a run is reproducible and a reserve trial plays another
// variant than the trial it replaces. The pilot (block -1) plays the base.
func (o Options) TrialTrace(block int, c Condition) (string, int) {
	conds := o.Conditions()
	i := slices.Index(conds, c)
	if o.Drift == 0 || block < 0 || i < 0 {
		return o.TracePath, 0
	}
	k := block*len(conds) + i + 1
	if k > len(o.Variants) {
		return o.TracePath, 0
	}
	return o.Variants[k-1], k
}

// runPilot learns the token the captured agent drew, which the record does
// not keep, from a pilot restore excluded like the seed's pilots.
func (rep *Report) runPilot(ctx context.Context, launch trialLauncher, spec TrialSpec, progress io.Writer) error {
	fmt.Fprintf(progress, "pilot trial (excluded): learning the guest agent's token\n")
	pilot, err := runPilot(ctx, launch.run, spec)
	if err != nil {
		return err
	}
	if leak := checkLeaks(pilot); leak != "" {
		rep.Leaks = append(rep.Leaks, leak)
	}
	rep.Pilot = &pilot
	return nil
}

// Run executes the protocol.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.VMM == "" {
		o.VMM = config.DriverReplay
	}
	o.Readaround = o.Readaround.withDefaults()
	launch := trialLauncher{exe: o.Exe, workRoot: o.WorkDir, grace: trialStopGrace, kill: o.Kill}
	if launch.exe == "" {
		var err error
		if launch.exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	rep := &Report{
		Options: ReportOptions{Snapshot: o.Source.SnapshotID, VMM: o.VMM, Device: o.Device, IOEngine: o.IOEngine,
			Blocks: o.Blocks, Seed: o.Seed, Policies: o.Policies, Drift: o.Drift, Learn: o.learnRestores(), Readaround: o.Readaround},
		Orders:  o.Orders(),
		Started: time.Now(),
	}
	b := &runner{o: o, rep: rep, launch: launch, hashes: map[string]string{}, sources: map[string]restore.Source{}, total: o.Blocks * len(o.Conditions())}
	// The base trace's hash first: a trace that cannot be read fails the
	// run before any trial.
	if _, err := b.expectedHash(o.TracePath); err != nil {
		return nil, err
	}
	printOrders(o.Progress, rep.Orders[:o.Blocks])
	if o.VMM == config.DriverQEMU && o.ExpectedToken == "" {
		spec, err := b.spec(-1, false, Condition{CacheWarm, PrefetchOff})
		if err != nil {
			return rep, err
		}
		if err := rep.runPilot(ctx, launch, spec, o.Progress); err != nil {
			return rep, err
		}
		b.o.ExpectedToken, b.o.ExpectedDigest = rep.Pilot.Token, rep.Pilot.Digest
	}
	if err := b.learnColumns(ctx); err != nil {
		return rep, err
	}
	var err error
	rep.Trials, rep.Replaced, err = runBlocks(rep.Orders, o.Blocks, func(block int, reserve bool, c Condition) (TrialResult, error) {
		return b.runOne(ctx, block, reserve, c)
	}, o.Progress)
	if err != nil {
		return rep, err
	}
	rep.Elapsed = time.Since(rep.Started)
	rep.Summary = summarize(o, rep.Trials)
	return rep, nil
}

// runner is one Run in progress: what every trial's spec and progress
// line needs.
type runner struct {
	o      Options
	rep    *Report
	launch trialLauncher
	// hashes are the replay VMM's expected hashes by trace path.
	hashes map[string]string
	// sources are the learned columns' sources (learnColumns).
	sources     map[string]restore.Source
	done, total int
}

// spec is the spec of the trial of c in block (a reserve block when
// reserve), playing the trace TrialTrace picks.
func (b *runner) spec(block int, reserve bool, c Condition) (TrialSpec, error) {
	o := b.o
	path, variant := o.TrialTrace(block, c)
	if o.Drift > 0 && block >= 0 && variant == 0 {
		return TrialSpec{}, fmt.Errorf("bench: --drift %v: no variant of the trace for block %d %s", o.Drift, block+1, c)
	}
	want, err := b.expectedHash(path)
	if err != nil {
		return TrialSpec{}, err
	}
	src, ok := b.sources[c.Prefetch]
	if !ok {
		src = o.Source
	}
	return TrialSpec{Block: block, Reserve: reserve, Condition: c, Device: o.Device, IOEngine: o.IOEngine,
		Source: src, MemoryPath: memdev.FilePath(src.Memory), VMM: o.VMM, QEMU: o.QEMU, TracePath: path, Variant: variant, ExpectedSHA256: want,
		ExpectedToken: o.ExpectedToken, ExpectedDigest: o.ExpectedDigest, Readaround: o.Readaround}, nil
}

// runOne runs one trial, says so on progress, notes leaks and hands the
// result to OnTrial; the report keeps it without its device events.
func (b *runner) runOne(ctx context.Context, block int, reserve bool, c Condition) (TrialResult, error) {
	o := b.o
	if err := ctx.Err(); err != nil {
		return TrialResult{}, fmt.Errorf("bench: interrupted before block %d %s: %w", block+1, c, err)
	}
	b.done++
	eta := etaSuffix(time.Since(b.rep.Started), b.done, b.total)
	if reserve {
		b.total++
		fmt.Fprintf(o.Progress, "reserve block %d trial %d/%d %s%s\n", block+1, b.done, b.total, c, eta)
	} else {
		fmt.Fprintf(o.Progress, "block %d/%d trial %d/%d %s%s\n", block+1, o.Blocks, b.done, b.total, c, eta)
	}
	spec, err := b.spec(block, reserve, c)
	if err != nil {
		return TrialResult{}, err
	}
	res, err := b.launch.run(ctx, spec)
	if err != nil {
		return res, err
	}
	if leak := checkLeaks(res); leak != "" {
		b.rep.Leaks = append(b.rep.Leaks, leak)
	}
	if o.OnTrial != nil {
		o.OnTrial(res)
	}
	res.Events, res.Observation = nil, nil
	return res, nil
}

// etaSuffix estimates the time left before trial done of total starts,
// from the mean of the done-1 trials that took elapsed; the first trial
// has nothing to go by.
func etaSuffix(elapsed time.Duration, done, total int) string {
	if done <= 1 {
		return ""
	}
	per := elapsed / time.Duration(done-1)
	return fmt.Sprintf(", ETA %s", (per * time.Duration(total-done+1)).Round(time.Second))
}

// expectedHash is the hash a correct restore's replay VMM reports over
// the bytes it reads playing the trace at path, computed once per trace;
// a real guest is checked otherwise, and has none.
func (b *runner) expectedHash(path string) (string, error) {
	if b.o.VMM != config.DriverReplay {
		return "", nil
	}
	if want, ok := b.hashes[path]; ok {
		return want, nil
	}
	entries, err := trace.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	want, err := replay.ExpectedHash(memdev.FilePath(b.o.Source.Memory), entries, nil)
	if err != nil {
		return "", fmt.Errorf("bench: expected hash: %w", err)
	}
	b.hashes[path] = want
	return want, nil
}

// printOrders shows the formal blocks' frozen orders before the first trial.
func printOrders(w io.Writer, orders [][]Condition) {
	for b, order := range orders {
		names := make([]string, len(order))
		for i, c := range order {
			names[i] = c.String()
		}
		fmt.Fprintf(w, "block %d order: %s\n", b+1, strings.Join(names, ", "))
	}
}

// pilotAttempts bounds the pilot's tries: like a formal trial, a pilot
// whose residency probe missed its threshold (the host reclaimed or kept
// page cache under it) says nothing about the guest and runs again.
const pilotAttempts = 3

// runPilot runs the excluded pilot trial, which must be admitted and
// answer with a token.
func runPilot(ctx context.Context, run func(context.Context, TrialSpec) (TrialResult, error), spec TrialSpec) (TrialResult, error) {
	var pilot TrialResult
	for range pilotAttempts {
		var err error
		if pilot, err = run(ctx, spec); err != nil {
			return pilot, err
		}
		if pilot.Err != "" {
			return pilot, fmt.Errorf("bench: pilot trial: %s", pilot.Err)
		}
		if !pilot.Admitted {
			continue
		}
		if pilot.Token == "" {
			return pilot, errors.New("bench: pilot trial: the guest agent answered without a token")
		}
		return pilot, nil
	}
	return pilot, fmt.Errorf("bench: pilot trial: not admitted in %d tries (last residency %v)", pilotAttempts, pilot.Residency)
}

// trialFunc runs one trial of condition c in block, a reserve block when
// reserve is set.
type trialFunc func(block int, reserve bool, c Condition) (TrialResult, error)

// slot is a formal trial that missed admission and awaits its replacement.
type slot struct {
	block int
	cond  Condition
}

// runBlocks runs the first blocks of orders, the formal blocks, each in its
// frozen order, then replaces every trial that missed admission from the
// reserve blocks that follow. It is Run without the processes, so the
// protocol's bookkeeping can be tested with a stand-in for run. It returns
// every formal trial (admitted or not) followed by the admitted
// replacements, and what was replaced, also when it stops with an error.
func runBlocks(orders [][]Condition, blocks int, run trialFunc, progress io.Writer) (trials []TrialResult, replaced []string, err error) {
	var missed []slot
	for b := 0; b < blocks; b++ {
		for _, c := range orders[b] {
			res, err := run(b, false, c)
			if err != nil {
				return trials, nil, err
			}
			if res.Err != "" {
				return trials, nil, fmt.Errorf("bench: block %d %s: %s", b+1, c, res.Err)
			}
			if !res.Admitted {
				fmt.Fprintf(progress, "  not admitted (%v); a reserve block replaces it\n", res.Residency)
				missed = append(missed, slot{b, c})
			}
			trials = append(trials, res)
		}
	}
	more, replaced, err := replaceMissed(missed, blocks, len(orders), run)
	return append(trials, more...), replaced, err
}

// replaceMissed runs a replacement of the same condition for each missed
// trial, in the order they missed, drawing from the reserve blocks first
// to end-1 in turn. A reserve block serves until one of its trials misses
// admission too; the next one then takes over. It returns the admitted
// replacements, each with the block of the trial it replaces, and a line
// per replacement.
func replaceMissed(missed []slot, first, end int, run trialFunc) (trials []TrialResult, replaced []string, err error) {
	reserve := first
	for len(missed) > 0 {
		if reserve >= end {
			return trials, replaced, fmt.Errorf("bench: %d trials missed admission and the reserve blocks are used up", len(missed))
		}
		m := missed[0]
		res, err := run(reserve, true, m.cond)
		if err != nil {
			return trials, replaced, err
		}
		if res.Err != "" {
			return trials, replaced, fmt.Errorf("bench: reserve block %d %s: %s", reserve+1, m.cond, res.Err)
		}
		if !res.Admitted {
			reserve++
			continue
		}
		// The replacement takes the missed trial's place in its block's pairs.
		replaced = append(replaced, fmt.Sprintf("block %d %s replaced from reserve block %d", m.block+1, m.cond, reserve+1))
		res.Spec.Block = m.block
		trials = append(trials, res)
		missed = missed[1:]
	}
	return trials, replaced, nil
}

// trialLauncher runs trials, each in its own process with its own private
// runtime directory under workRoot, and takes an interrupted one down.
type trialLauncher struct {
	exe      string
	workRoot string
	// grace is how long an interrupted trial may take to stop cleanly.
	grace time.Duration
	// kill, once closed, kills the running trial at once.
	kill <-chan struct{}
}

// run runs one trial process. When ctx ends the trial is asked to stop
// (SIGTERM): it stops its restores in the seed's order, unmounts its
// device and exits; it is killed if that takes longer than the grace, or
// as soon as kill closes. Its directory is removed afterwards whatever
// happened.
func (l trialLauncher) run(ctx context.Context, spec TrialSpec) (res TrialResult, err error) {
	dir, err := os.MkdirTemp(l.workRoot, "trial-")
	if err != nil {
		return TrialResult{}, fmt.Errorf("bench: %w", err)
	}
	defer func() {
		if rmErr := node.RemoveWorkDir(dir); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("bench: trial %s: %w", spec.Condition, rmErr))
		}
	}()
	spec.WorkDir = dir
	in, _ := json.Marshal(spec)
	cmd := exec.CommandContext(ctx, l.exe)
	cmd.Env = reexec.Environ(os.Environ(), RoleTrial)
	cmd.Stdin = bytes.NewReader(in)
	var out, errBuf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errBuf
	// Its own process group: a terminal's Ctrl-C reaches only this
	// process, which stops the trial in order, rather than killing the
	// trial and its VMM all at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	if err := cmd.Start(); err != nil {
		return TrialResult{}, fmt.Errorf("bench: trial %s: %w", spec.Condition, err)
	}
	exited, enforced := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(enforced)
		l.killIfStuck(ctx, cmd.Process, dir, exited)
	}()
	err = cmd.Wait()
	close(exited)
	<-enforced
	if ctx.Err() != nil {
		// Whatever the trial reports, it did not run to the end.
		if err != nil && !errors.Is(err, ctx.Err()) {
			return TrialResult{}, fmt.Errorf("bench: trial %s interrupted (%v): %w", spec.Condition, err, ctx.Err())
		}
		return TrialResult{}, fmt.Errorf("bench: trial %s interrupted: %w", spec.Condition, ctx.Err())
	}
	if err != nil {
		return TrialResult{}, fmt.Errorf("bench: trial %s: %w\n%s", spec.Condition, err, lastLines(errBuf.String(), 20))
	}
	res, err = readResult(&out)
	if err != nil {
		return res, fmt.Errorf("bench: trial %s: %w\n%s", spec.Condition, err, lastLines(errBuf.String(), 20))
	}
	// The trial process has exited: whatever it left is a leak.
	if socks := socketsUnder(dir); len(socks) > 0 {
		res.Err = fmt.Sprintf("sockets left behind: %s", strings.Join(socks, ", "))
	}
	if mounts := mountsUnder(dir); len(mounts) > 0 {
		points := make([]string, len(mounts))
		for i, m := range mounts {
			points[i] = m.point
		}
		res.Err = fmt.Sprintf("mounts left behind: %s", strings.Join(points, ", "))
	}
	return res, nil
}

// killIfStuck kills the trial process p if it is still running once kill
// closes, or grace after ctx ends. Its FUSE connections are cut first: a
// FUSE server killed while one of its own threads waits on a request to
// its own mount (a prefetch read, or go-fuse's probe right after
// mounting) would never exit, since the kernel waits for the answer
// uninterruptibly and closes the connection only once that thread has
// exited.
func (l trialLauncher) killIfStuck(ctx context.Context, p *os.Process, dir string, exited <-chan struct{}) {
	select {
	case <-exited:
		return
	case <-l.kill:
	case <-ctx.Done():
		grace := time.NewTimer(l.grace)
		defer grace.Stop()
		select {
		case <-exited:
			return
		case <-l.kill:
		case <-grace.C:
		}
	}
	abortFUSEMounts(dir)
	p.Kill()
}

// abortFUSEMounts aborts the connections of the FUSE mounts at or below
// dir, as umount -f does: every request in flight fails, and every later
// one. The unmount itself may fail (busy); removeTrialDir detaches what
// stays once the server has exited.
func abortFUSEMounts(dir string) {
	for _, m := range mountsUnder(dir) {
		if strings.HasPrefix(m.fstype, "fuse") {
			unix.Unmount(m.point, unix.MNT_FORCE)
		}
	}
}

// mount is one line of /proc/self/mountinfo.
type mount struct{ point, fstype string }

// mountsUnder lists the mounts at or below dir. A FUSE mount whose server
// exited without unmounting stays until someone detaches it.
func mountsUnder(dir string) []mount {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var found []mount
	for _, line := range strings.Split(string(data), "\n") {
		// The fifth field is the mount point (octal escapes are rare
		// enough in a MkdirTemp path to compare raw); the type follows
		// the "-" that ends the optional fields.
		f := strings.Fields(line)
		if len(f) <= 4 || (f[4] != dir && !strings.HasPrefix(f[4], dir+"/")) {
			continue
		}
		m := mount{point: f[4]}
		if i := slices.Index(f[5:], "-"); i >= 0 && 5+i+1 < len(f) {
			m.fstype = f[5+i+1]
		}
		found = append(found, m)
	}
	return found
}

// checkLeaks reports VMM processes a trial left running.
func checkLeaks(res TrialResult) string {
	var alive []string
	for _, pid := range res.ReplayPIDs {
		if err := syscall.Kill(pid, 0); err == nil {
			alive = append(alive, fmt.Sprint(pid))
		}
	}
	if len(alive) > 0 {
		return fmt.Sprintf("block %d %s: VMM processes still running: %s", res.Spec.Block+1, res.Spec.Condition, strings.Join(alive, ", "))
	}
	return ""
}

func socketsUnder(dir string) []string {
	var socks []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type()&os.ModeSocket != 0 {
			socks = append(socks, p)
		}
		return nil
	})
	return socks
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
