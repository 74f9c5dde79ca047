package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/lab/pagecache"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/node"
	"warmstart/internal/prefetch"
	"warmstart/internal/refine"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/qemu"
	"warmstart/internal/vmm/replay"
)

// Cache states of the memory lower file before a timed restore.
const (
	CacheWarm = "warm" // every page of a fresh private copy resident
	CacheCold = "cold" // none resident: one POSIX_FADV_DONTNEED on that copy
	CacheHot  = "hot"  // hot control: the device generation itself stays warm
)

// PrefetchOff is the prefetch column of the baseline.
const PrefetchOff = "off"

// Condition is one cell of the protocol: a cache state and a prefetch policy.
type Condition struct {
	Cache    string `json:"cache"`
	Prefetch string `json:"prefetch"` // "off" or a policy name
}

func (c Condition) String() string { return "file-" + c.Cache + "/prefetch-" + c.Prefetch }

// TrialSpec is what the parent hands one trial process.
type TrialSpec struct {
	Block     int            `json:"block"`
	Reserve   bool           `json:"reserve"`
	Condition Condition      `json:"condition"`
	Device    string         `json:"device"`
	IOEngine  int            `json:"io_engine"`
	Source    restore.Source `json:"source"`
	// MemoryPath is the snapshot's memory file: the trial serves a private
	// copy of it (Source.Memory is set in the trial's process).
	MemoryPath string `json:"memory_path"`
	// VMM is the driver the trial restores with: config.DriverReplay (also when
	// empty) or config.DriverQEMU.
	VMM string `json:"vmm,omitempty"`
	// QEMU configures the qemu driver. Its Accel should be resolved (not
	// auto), so that no trial spends its time probing the host.
	QEMU      qemu.Options `json:"qemu"`
	TracePath string       `json:"trace_path"`
	// Variant is the drifting variant of the reference trace TracePath
	// is (synth.VariantPath); 0 for the base trace.
	Variant int `json:"variant,omitempty"`
	// ExpectedSHA256 is the hash a correct restore's replay VMM reports.
	ExpectedSHA256 string `json:"expected_sha256"`
	// ExpectedToken is the token a correct restore's real guest answers
	// with; empty accepts any (the pilot trial that learns it).
	ExpectedToken string `json:"expected_token,omitempty"`
	// ExpectedDigest is the agent's digest of its heap and files.
	ExpectedDigest string `json:"expected_digest,omitempty"`
	// WorkDir is the trial's private runtime directory.
	WorkDir string `json:"work_dir"`
	// Readaround is the windows the trial's file devices mount with.
	Readaround Readaround `json:"readaround"`
	// CPUProfile, when set, is the file the trial writes a CPU profile of
	// its timed restore to (start to ready).
	CPUProfile string `json:"cpu_profile,omitempty"`
	// Concurrency is how many timed restores of the snapshot the trial
	// starts at once on its node (concurrent.go); 0 and 1 mean one.
	Concurrency int `json:"concurrency,omitempty"`
}

// TrialResult is what one trial process reports.
type TrialResult struct {
	Spec TrialSpec `json:"spec"`
	// Admitted is false when the residency probe missed its threshold.
	Admitted  bool                `json:"admitted"`
	Residency pagecache.Residency `json:"residency"`
	// ProbeGap is the time from the end of the residency probe to the timer start.
	ProbeGap time.Duration `json:"probe_gap_ns"`
	// ReadyMs is the time to ready of the timed restore, for the tables
	// and charts; of the slowest one when several ran at once
	// (TrialSpec.Concurrency), each of which ConcurrentReady then holds.
	// In JSON the slowest is slowest_ready_ns.
	ReadyMs         float64         `json:"-"`
	SlowestReady    time.Duration   `json:"slowest_ready_ns"`
	ConcurrentReady []time.Duration `json:"concurrent_ready_ns,omitempty"`
	// Concurrent is each concurrent restore's own account, in start order,
	// and HostCPU what the host's CPUs did over them (nil for one restore).
	Concurrent  []ConcurrentRestore    `json:"concurrent,omitempty"`
	HostCPU     *HostCPU               `json:"host_cpu,omitempty"`
	Timings     restore.Timings        `json:"timings"`
	Prefetch    restore.PrefetchReport `json:"prefetch"`
	DeviceBytes memdev.Counters        `json:"device_bytes"`
	// Cost is the timed restore's CPU and I/O until ready; of all of
	// them for concurrent restores (trialCost).
	Cost restore.Cost `json:"cost"`
	// HashOK says the guest saw the snapshot's memory: for the replay VMM
	// its hash over the bytes it read matched; for a real guest the agent
	// answered with the snapshot's token and the private lower file's
	// SHA-256 was unchanged after the restore.
	HashOK bool `json:"hash_ok"`
	// Token is the real guest agent's answer to the timed restore.
	Token string `json:"token,omitempty"`
	// Digest is the agent's digest of its heap and files.
	Digest string             `json:"digest,omitempty"`
	Stop   restore.StopReport `json:"stop"`
	// StartupSet is the timed restore's startup-set accounting: in time,
	// late, unused and missed pages against the snapshot's manifest.
	StartupSet startupset.Report `json:"startup_set"`
	// Events are what the timed restore's memory device served until
	// ready, for a parent that learns from them (Options.OnTrial); the
	// report keeps none, so --json stays the size of its numbers.
	Events []startupset.Event `json:"events,omitempty"`
	// Observation is what the timed restore saw of the manifest it
	// prefetched (refine), for a learning restore; nil without prefetch.
	// Like Events, the parent drops it before the report.
	Observation *refine.Observation `json:"observation,omitempty"`
	// ReplayPIDs are the VMM processes the trial started, for the leak check.
	ReplayPIDs []int  `json:"replay_pids"`
	Err        string `json:"error,omitempty"`
}

// RoleTrial is the role (reexec.Env) of a benchmark trial: TrialMain.
const RoleTrial = "bench-trial"

// TrialMain runs one trial: the entry point of role RoleTrial, which the
// executable running the benchmark lists in the roles its main (and
// TestMain) dispatches. It reads the spec on stdin and writes the result
// on stdout.
func TrialMain() int {
	// An interrupted parent asks the trial to stop with SIGTERM; the trial
	// then stops its restores in the seed's order and unmounts its device
	// before it reports and exits.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	var spec TrialSpec
	res := TrialResult{}
	if err := json.NewDecoder(os.Stdin).Decode(&spec); err != nil {
		res.Err = fmt.Sprintf("read trial spec: %v", err)
	} else {
		res = RunTrial(ctx, spec)
	}
	stop()
	json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// RunTrial runs one trial of the protocol in this process, as the seed
// prescribes: an untimed prefetch-off baseline restore, stopped with its
// device release acknowledged; a new, independently copied private lower
// file, read fully and SHA-256-checked; cache left warm or dropped; a
// mincore admission probe; then the timed restore. When ctx ends the trial
// stops where it is; every restore it made is stopped in full regardless.
func RunTrial(ctx context.Context, spec TrialSpec) TrialResult {
	t := &trial{spec: spec, res: TrialResult{Spec: spec}, ctx: ctx,
		// A stop with a done context would neither wait for the prefetch
		// reads nor for the device's release acknowledgement before the
		// mount goes.
		stopCtx: context.WithoutCancel(ctx)}
	if spec.MemoryPath == "" {
		return t.fail(errors.New("trial spec names no memory file (a snapshot whose memory is not a local file)"))
	}
	t.spec.Source.Memory = memdev.File(spec.MemoryPath)
	closeMount, err := t.setUp()
	if err != nil {
		return t.fail(err)
	}
	defer closeMount()
	if err := t.baseline(); err != nil {
		return t.fail(err)
	}
	src, copySHA256, err := t.privateLower()
	if err != nil {
		return t.fail(err)
	}
	hot, err := t.treatCache(src)
	if hot != nil {
		defer hot.Stop(t.stopCtx)
	}
	if err != nil {
		return t.fail(err)
	}
	admitted, err := t.admit(src)
	if err != nil || !admitted {
		return t.failIf(err)
	}
	inst, err := t.timed(src)
	if err != nil {
		return t.fail(err)
	}
	if hot != nil {
		if err := hot.Stop(t.stopCtx); err != nil {
			return t.fail(err)
		}
	}
	return t.failIf(t.check(inst, src, copySHA256))
}

// trial is one RunTrial in progress.
type trial struct {
	spec    TrialSpec
	res     TrialResult
	ctx     context.Context
	stopCtx context.Context
	r       *restore.Restorer
	base    restore.Options
	// mode, policy and unverified are the timed restore's.
	mode       restore.Mode
	policy     restore.Policy
	unverified bool
	// lowerPath is the trial's private copy of the memory file.
	lowerPath string
	// probed is when the admission probe ended.
	probed time.Time
}

func (t *trial) fail(err error) TrialResult {
	t.res.Err = err.Error()
	return t.res
}

func (t *trial) failIf(err error) TrialResult {
	if err != nil {
		return t.fail(err)
	}
	return t.res
}

// setUp assembles the trial's restorer and its device mounts as a node
// does (node.OpenRestorer), with the trial's windows and VMM; the returned
// function unmounts them.
func (t *trial) setUp() (func() error, error) {
	var err error
	if t.mode, t.policy, t.unverified, err = policyOf(t.spec.Condition.Prefetch); err != nil {
		return nil, err
	}
	vm, err := trialVMM(t.spec)
	if err != nil {
		return nil, err
	}
	rs, err := node.OpenRestorer(node.RestorerOptions{
		VMM:                    vm,
		RuntimeDir:             t.spec.WorkDir,
		Mount:                  filepath.Join(t.spec.WorkDir, "mnt"),
		FUSE:                   fusedev.Options{ReadAheadBytes: t.spec.Readaround.ServingBytes, Passthrough: passthroughColumn(t.spec.Condition.Prefetch)},
		PrefetchReadAheadBytes: t.prefetchingWindow(),
		// The engine runs as many readers as the policy was designed for
		// (config.DefaultPrefetchMaxReaders says why).
		Engine: prefetch.Options{MaxReaders: max(t.policy.MaxReaders, prefetch.DefaultMaxReaders)},
	})
	if err != nil {
		return nil, err
	}
	t.r = rs.Restorer
	t.base = restore.Options{Device: t.spec.Device, IOEngine: t.spec.IOEngine}
	return rs.Close, nil
}

// prefetchingWindow is the readaround window of the mount of a trial
// whose timed restore prefetches on the file device, as a node's; 0 (no
// such mount) otherwise.
func (t *trial) prefetchingWindow() int {
	if t.mode == restore.ModeOff || t.spec.Device != config.DeviceFile {
		return 0
	}
	return t.spec.Readaround.withDefaults().PrefetchingBytes
}

// startProfile starts a CPU profile into path; the returned function
// stops it and closes the file. No path, no profile.
func startProfile(path string) (func() error, error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile %s: %w", path, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("cpu profile %s: %w", path, err)
		}
		return nil
	}, nil
}

// track notes the replay VMM a restore ran, so the parent can check that
// it is gone.
func (t *trial) track(inst *restore.Instance) {
	if pid := inst.Ready.Detail.PID; pid > 0 {
		t.res.ReplayPIDs = append(t.res.ReplayPIDs, pid)
	}
}

// baseline is the untimed prefetch-off restore, released and acknowledged
// before anything else.
func (t *trial) baseline() error {
	inst, err := t.r.Restore(t.ctx, t.spec.Source, withMode(t.base, restore.ModeOff, restore.Policy{}, "baseline"))
	if err != nil {
		return fmt.Errorf("baseline restore: %w", err)
	}
	t.track(inst)
	if err := inst.Stop(t.stopCtx); err != nil {
		return fmt.Errorf("baseline stop: %w", err)
	}
	if err := t.ctx.Err(); err != nil {
		return fmt.Errorf("interrupted after the baseline: %w", err)
	}
	return nil
}

// privateLower copies the lower file, so the cache treatment touches no
// other file, and returns the source on the copy and its SHA-256.
func (t *trial) privateLower() (restore.Source, string, error) {
	src := t.spec.Source
	t.lowerPath = filepath.Join(t.spec.WorkDir, "memory.bin")
	src.Memory = memdev.File(t.lowerPath)
	sum, err := pagecache.CopyVerified(t.spec.MemoryPath, t.lowerPath)
	if err != nil {
		return src, "", err
	}
	if err := t.ctx.Err(); err != nil {
		return src, "", fmt.Errorf("interrupted after copying the lower file: %w", err)
	}
	return src, sum, nil
}

// treatCache leaves the copy cold or, for the hot control, returns a warm
// instance, held still: its device generation, and so the device file's
// page cache, stays referenced while the timed restore shares it.
func (t *trial) treatCache(src restore.Source) (*warmControl, error) {
	switch t.spec.Condition.Cache {
	case CacheCold:
		return nil, pagecache.Evict(t.lowerPath)
	case CacheHot:
		hot, err := holdWarm(t.ctx, t.r, src, withMode(t.base, restore.ModeOff, restore.Policy{}, "timed"))
		if err != nil {
			return nil, fmt.Errorf("hot control warm-up: %w", err)
		}
		t.track(hot.inst)
		return hot, nil
	}
	return nil, nil
}

// admit probes residency, the last thing before the timer.
func (t *trial) admit(src restore.Source) (bool, error) {
	var err error
	if t.res.Residency, err = pagecache.Probe(t.lowerPath); err != nil {
		return false, err
	}
	t.probed = time.Now()
	t.res.Admitted = admitted(t.spec.Condition.Cache, t.res.Residency)
	return t.res.Admitted, nil
}

// timed is the timed restore, stopped with its report.
func (t *trial) timed(src restore.Source) (*restore.Instance, error) {
	t.res.ProbeGap = time.Since(t.probed)
	opts := withMode(t.base, t.mode, t.policy, "timed")
	opts.Unverified = t.unverified
	opts.StrongDigests = strongColumn(t.spec.Condition.Prefetch)
	stopProfile, err := startProfile(t.spec.CPUProfile)
	if err != nil {
		return nil, err
	}
	host0, hostOK := readHostCPU()
	insts, err := t.restoreConcurrently(src, opts)
	if host1, ok := readHostCPU(); ok && hostOK && len(insts) > 1 {
		h := host1.Sub(host0)
		t.res.HostCPU = &h
	}
	perr := stopProfile()
	if err == nil && perr != nil {
		// The profile is lost, not the restores: stop them in order.
		return nil, errors.Join(perr, t.stopAll(insts))
	}
	if err != nil {
		return nil, fmt.Errorf("timed restore: %w", err)
	}
	inst := insts[0]
	t.res.Timings, t.res.Prefetch, t.res.DeviceBytes, t.res.Cost = inst.Timings, inst.Prefetch, inst.DeviceBytes, inst.Cost
	t.res.StartupSet, t.res.Events, t.res.Observation = inst.StartupSet, inst.Events, inst.Observation
	t.res.Token, t.res.Digest = inst.Ready.Detail.Token, inst.Ready.Detail.Digest
	t.res.HashOK = true
	for _, in := range insts {
		t.track(in)
		t.res.SlowestReady = max(t.res.SlowestReady, in.Timings.Ready)
		if len(insts) > 1 {
			t.res.ConcurrentReady = append(t.res.ConcurrentReady, in.Timings.Ready)
			t.res.Concurrent = append(t.res.Concurrent, concurrentRestoreOf(in))
		}
		t.res.HashOK = t.res.HashOK && in.Ready.Detail.SHA256 == t.spec.ExpectedSHA256
	}
	if len(insts) > 1 {
		t.res.Cost = trialCost(insts)
	}
	t.res.ReadyMs = float64(t.res.SlowestReady) / float64(time.Millisecond)
	t.res.Stop, err = inst.StopReported(t.stopCtx)
	return inst, errors.Join(err, t.stopAll(insts[1:]))
}

// check verifies what the timed restore's guest read: the replay VMM's
// hash, or (outside the timer, once every VM on the file has stopped) the
// real guest's answer and the private lower file.
func (t *trial) check(inst *restore.Instance, src restore.Source, copySHA256 string) error {
	if t.spec.VMM == config.DriverQEMU {
		if err := checkRealGuest(t.spec, t.res.Token, t.res.Digest, t.lowerPath, copySHA256); err != nil {
			return err
		}
		t.res.HashOK = true
	}
	if !t.res.HashOK {
		return fmt.Errorf("replay VMM read wrong bytes: sha256 %s, want %s", inst.Ready.Detail.SHA256, t.spec.ExpectedSHA256)
	}
	return nil
}

// admitted reports whether the probed residency of the lower file is what
// the cache state needs when the timer starts: no page resident for
// file-cold, every page for file-warm and the hot control. Anything in
// between (another process read or evicted part of the file) would time a
// mixture of both states.
func admitted(cache string, r pagecache.Residency) bool {
	if cache == CacheCold {
		return r.None()
	}
	return r.Full()
}

// trialVMM builds the trial's VMM driver; node.OpenRestorer lets QEMU
// open the device file for writing, as it does before mapping it private.
func trialVMM(spec TrialSpec) (vmm.VMM, error) {
	switch spec.VMM {
	case "", config.DriverReplay:
		return &replay.VMM{TracePath: spec.TracePath}, nil
	case config.DriverQEMU:
		return qemu.New(spec.QEMU)
	}
	return nil, fmt.Errorf("trial VMM %q: want %s or %s", spec.VMM, config.DriverReplay, config.DriverQEMU)
}

// checkRealGuest is a real guest's stand-in for the replay VMM's hash: the
// agent answered with the token the captured guest drew, which it holds
// only in memory, and with the digest of its heap and files it had before
// the snapshot; and the lower file the device served is still the copy
// that was verified before the restore (guest writes are private).
func checkRealGuest(spec TrialSpec, token, digest, memPath, wantSHA256 string) error {
	if spec.ExpectedToken != "" && token != spec.ExpectedToken {
		return fmt.Errorf("guest agent answered with token %q, the snapshot's is %q", token, spec.ExpectedToken)
	}
	if spec.ExpectedDigest != "" && digest != spec.ExpectedDigest {
		return fmt.Errorf("guest agent's heap and file digest is %q, the snapshot's is %q", digest, spec.ExpectedDigest)
	}
	sum, err := pagecache.HashFile(memPath)
	if err != nil {
		return err
	}
	if sum != wantSHA256 {
		return fmt.Errorf("memory lower file changed during the restore: sha256 %s, was %s", sum, wantSHA256)
	}
	return nil
}

func withMode(o restore.Options, m restore.Mode, p restore.Policy, key string) restore.Options {
	o.Prefetch, o.Policy, o.DeviceKey = m, p, key
	return o
}

// readResult decodes a trial's report.
func readResult(r io.Reader) (TrialResult, error) {
	var res TrialResult
	if err := json.NewDecoder(r).Decode(&res); err != nil {
		return res, fmt.Errorf("read trial result: %w", err)
	}
	res.ReadyMs = float64(res.SlowestReady) / float64(time.Millisecond)
	return res, nil
}
