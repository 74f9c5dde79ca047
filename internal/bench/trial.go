package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/pagecache"
	"warmstart/internal/prefetch"
	"warmstart/internal/restore"
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
	// VMM is the driver the trial restores with: VMMReplay (also when
	// empty) or VMMQEMU.
	VMM string `json:"vmm,omitempty"`
	// QEMU configures the qemu driver. Its Accel should be resolved (not
	// auto), so that no trial spends its time probing the host.
	QEMU      qemu.Options `json:"qemu"`
	TracePath string       `json:"trace_path"`
	// ExpectedSHA256 is the hash a correct restore's replay VMM reports.
	ExpectedSHA256 string `json:"expected_sha256"`
	// ExpectedToken is the token a correct restore's real guest answers
	// with; empty accepts any (the pilot trial that learns it).
	ExpectedToken string `json:"expected_token,omitempty"`
	// ExpectedDigest is the agent's digest of its heap and files.
	ExpectedDigest string `json:"expected_digest,omitempty"`
	// WorkDir is the trial's private runtime directory.
	WorkDir string `json:"work_dir"`
}

// TrialResult is what one trial process reports.
type TrialResult struct {
	Spec TrialSpec `json:"spec"`
	// Admitted is false when the residency probe missed its threshold.
	Admitted  bool                `json:"admitted"`
	Residency pagecache.Residency `json:"residency"`
	// ProbeGap is the time from the end of the residency probe to the timer start.
	ProbeGap    time.Duration          `json:"probe_gap_ns"`
	ReadyMs     float64                `json:"ready_ms"`
	Timings     restore.Timings        `json:"timings"`
	Prefetch    restore.PrefetchReport `json:"prefetch"`
	DeviceBytes memdev.Counters        `json:"device_bytes"`
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
	// ReplayPIDs are the VMM processes the trial started, for the leak check.
	ReplayPIDs []int  `json:"replay_pids"`
	Err        string `json:"error,omitempty"`
}

// trialRole is the environment value that makes this executable a trial.
const trialRole = "bench-trial"

// RunTrialIfRequested runs a trial and exits when this process was started
// as one. main and TestMain call it first.
func RunTrialIfRequested() {
	if os.Getenv(roleEnv) != trialRole {
		return
	}
	os.Unsetenv(roleEnv)
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
	os.Exit(0)
}

// roleEnv is the variable the replay VMM and the trial share to tell a
// child which part to play.
const roleEnv = "WARMSTART_ROLE"

// RunTrial runs one trial of the protocol in this process, as the seed
// prescribes: an untimed prefetch-off baseline restore, stopped with its
// device release acknowledged; a new, independently copied private lower
// file, read fully and SHA-256-checked; cache left warm or dropped; a
// mincore admission probe; then the timed restore. When ctx ends the trial
// stops where it is; every restore it made is stopped in full regardless.
func RunTrial(ctx context.Context, spec TrialSpec) (res TrialResult) {
	res.Spec = spec
	fail := func(err error) TrialResult {
		res.Err = err.Error()
		return res
	}
	// A stop with a done context would neither wait for the prefetch
	// reads nor for the device's release acknowledgement before the
	// mount goes.
	stopCtx := context.WithoutCancel(ctx)
	mode, policy, unverified, err := policyOf(spec.Condition.Prefetch)
	if err != nil {
		return fail(err)
	}

	vm, mountOpts, err := trialVMM(spec)
	if err != nil {
		return fail(err)
	}
	srv, err := fusedev.Mount(filepath.Join(spec.WorkDir, "mnt"), mountOpts)
	if err != nil {
		return fail(err)
	}
	defer srv.Close()
	r := &restore.Restorer{
		FUSE:       srv,
		Engine:     prefetch.NewEngine(prefetch.Options{MaxReaders: max(policy.MaxReaders, prefetch.DefaultMaxReaders)}),
		VMM:        vm,
		RuntimeDir: spec.WorkDir,
		// Only the timed restore of an unverified column skips it; the
		// flag is set just before it.
	}
	base := restore.Options{Device: spec.Device, IOEngine: spec.IOEngine}
	track := func(inst *restore.Instance) {
		if pid, err := strconv.Atoi(inst.Ready.Detail["pid"]); err == nil {
			res.ReplayPIDs = append(res.ReplayPIDs, pid)
		}
	}

	// Untimed baseline, released and acknowledged before anything else.
	inst, err := r.Restore(ctx, spec.Source, withMode(base, restore.ModeOff, restore.Policy{}, "baseline"))
	if err != nil {
		return fail(fmt.Errorf("baseline restore: %w", err))
	}
	track(inst)
	if err := inst.Stop(stopCtx); err != nil {
		return fail(fmt.Errorf("baseline stop: %w", err))
	}
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("interrupted after the baseline: %w", err))
	}

	// A private lower file, so the cache treatment touches no other file.
	src := spec.Source
	src.MemoryPath = filepath.Join(spec.WorkDir, "memory.bin")
	copySHA256, err := pagecache.CopyVerified(spec.Source.MemoryPath, src.MemoryPath)
	if err != nil {
		return fail(err)
	}
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("interrupted after copying the lower file: %w", err))
	}
	key := "timed"
	var hot *restore.Instance
	switch spec.Condition.Cache {
	case CacheCold:
		if err := pagecache.Evict(src.MemoryPath); err != nil {
			return fail(err)
		}
	case CacheHot:
		// The hot control keeps a warm instance: its device generation, and
		// so the device file's page cache, stays referenced while the timed
		// restore shares it.
		hot, err = r.Restore(ctx, src, withMode(base, restore.ModeOff, restore.Policy{}, key))
		if err != nil {
			return fail(fmt.Errorf("hot control warm-up: %w", err))
		}
		track(hot)
		defer hot.Stop(stopCtx)
	}

	// Admission: the probe is the last thing before the timer.
	res.Residency, err = pagecache.Probe(src.MemoryPath)
	if err != nil {
		return fail(err)
	}
	probed := time.Now()
	res.Admitted = admitted(spec.Condition.Cache, res.Residency)
	if !res.Admitted {
		return res
	}

	r.SkipVerification = unverified
	t0 := time.Now()
	res.ProbeGap = t0.Sub(probed)
	inst, err = r.Restore(ctx, src, withMode(base, mode, policy, key))
	if err != nil {
		return fail(fmt.Errorf("timed restore: %w", err))
	}
	res.ReadyMs = float64(inst.Timings.Ready) / float64(time.Millisecond)
	track(inst)
	res.Timings, res.Prefetch, res.DeviceBytes = inst.Timings, inst.Prefetch, inst.DeviceBytes
	res.Token, res.Digest = inst.Ready.Detail["token"], inst.Ready.Detail["digest"]
	res.HashOK = inst.Ready.Detail["sha256"] == spec.ExpectedSHA256
	res.Stop, err = inst.StopReported(stopCtx)
	if err != nil {
		return fail(err)
	}
	if hot != nil {
		if err := hot.Stop(stopCtx); err != nil {
			return fail(err)
		}
	}
	if spec.VMM == VMMQEMU {
		// Outside the timer, once every VM on the file has stopped.
		if err := checkRealGuest(spec, res.Token, res.Digest, src.MemoryPath, copySHA256); err != nil {
			return fail(err)
		}
		res.HashOK = true
	}
	if !res.HashOK {
		return fail(fmt.Errorf("replay VMM read wrong bytes: sha256 %s, want %s", inst.Ready.Detail["sha256"], spec.ExpectedSHA256))
	}
	return res
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

// VMM drivers a trial can restore with.
const (
	VMMReplay = "replay"
	VMMQEMU   = "qemu"
)

// trialVMM builds the trial's VMM driver and the options of its FUSE mount.
func trialVMM(spec TrialSpec) (vmm.VMM, fusedev.Options, error) {
	switch spec.VMM {
	case "", VMMReplay:
		return &replay.VMM{TracePath: spec.TracePath}, fusedev.Options{}, nil
	case VMMQEMU:
		d, err := qemu.New(spec.QEMU)
		if err != nil {
			return nil, fusedev.Options{}, err
		}
		// QEMU opens the device file read-write before mapping it private.
		return d, fusedev.Options{AllowWriteOpen: true}, nil
	}
	return nil, fusedev.Options{}, fmt.Errorf("trial VMM %q: want %s or %s", spec.VMM, VMMReplay, VMMQEMU)
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
	return res, nil
}
