package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/pagecache"
	"warmstart/internal/prefetch"
	"warmstart/internal/restore"
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
	TracePath string         `json:"trace_path"`
	// ExpectedSHA256 is the hash a correct restore's replay VMM reports.
	ExpectedSHA256 string `json:"expected_sha256"`
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
	HashOK      bool                   `json:"hash_ok"`
	Stop        restore.StopReport     `json:"stop"`
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
	var spec TrialSpec
	res := TrialResult{}
	if err := json.NewDecoder(os.Stdin).Decode(&spec); err != nil {
		res.Err = fmt.Sprintf("read trial spec: %v", err)
	} else {
		res = RunTrial(context.Background(), spec)
	}
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
// mincore admission probe; then the timed restore.
func RunTrial(ctx context.Context, spec TrialSpec) (res TrialResult) {
	res.Spec = spec
	fail := func(err error) TrialResult {
		res.Err = err.Error()
		return res
	}
	policy := restore.Policy{}
	mode := restore.ModeOff
	if spec.Condition.Prefetch != PrefetchOff {
		p, err := restore.LookupPolicy(spec.Condition.Prefetch)
		if err != nil {
			return fail(err)
		}
		policy, mode = p, restore.ModeOn
	}

	srv, err := fusedev.Mount(filepath.Join(spec.WorkDir, "mnt"), fusedev.Options{})
	if err != nil {
		return fail(err)
	}
	defer srv.Close()
	vm := &replay.VMM{TracePath: spec.TracePath}
	r := &restore.Restorer{
		FUSE:       srv,
		Engine:     prefetch.NewEngine(prefetch.Options{MaxReaders: max(policy.MaxReaders, prefetch.DefaultMaxReaders)}),
		VMM:        vm,
		RuntimeDir: spec.WorkDir,
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
	if err := inst.Stop(ctx); err != nil {
		return fail(fmt.Errorf("baseline stop: %w", err))
	}

	// A private lower file, so the cache treatment touches no other file.
	src := spec.Source
	src.MemoryPath = filepath.Join(spec.WorkDir, "memory.bin")
	if _, err := pagecache.CopyVerified(spec.Source.MemoryPath, src.MemoryPath); err != nil {
		return fail(err)
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
		defer hot.Stop(context.WithoutCancel(ctx))
	}

	// Admission: the probe is the last thing before the timer.
	res.Residency, err = pagecache.Probe(src.MemoryPath)
	if err != nil {
		return fail(err)
	}
	probed := time.Now()
	switch spec.Condition.Cache {
	case CacheCold:
		res.Admitted = res.Residency.None()
	default:
		res.Admitted = res.Residency.Full()
	}
	if !res.Admitted {
		return res
	}

	t0 := time.Now()
	res.ProbeGap = t0.Sub(probed)
	inst, err = r.Restore(ctx, src, withMode(base, mode, policy, key))
	if err != nil {
		return fail(fmt.Errorf("timed restore: %w", err))
	}
	res.ReadyMs = float64(inst.Timings.Ready) / float64(time.Millisecond)
	track(inst)
	res.Timings, res.Prefetch, res.DeviceBytes = inst.Timings, inst.Prefetch, inst.DeviceBytes
	res.HashOK = inst.Ready.Detail["sha256"] == spec.ExpectedSHA256
	res.Stop, err = inst.StopReported(ctx)
	if err != nil {
		return fail(err)
	}
	if hot != nil {
		if err := hot.Stop(ctx); err != nil {
			return fail(err)
		}
	}
	if !res.HashOK {
		return fail(fmt.Errorf("replay VMM read wrong bytes: sha256 %s, want %s", inst.Ready.Detail["sha256"], spec.ExpectedSHA256))
	}
	return res
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
