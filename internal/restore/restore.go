// Package restore orchestrates one snapshot restore and its shutdown: it
// acquires the memory device, validates the startup manifest, starts the
// prefetch concurrently with the VMM loading the snapshot, waits for the
// guest to be ready, and stops in the seed's order (stop the VM, wait for
// the prefetch reads to exit, keep the device until then, release it and
// wait for the acknowledgement).
package restore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"warmstart/internal/fsx"
	"warmstart/internal/integrity"
	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/refine"
	"warmstart/internal/repository"
	"warmstart/internal/startupset"
	"warmstart/internal/trust"
	"warmstart/internal/vmm"
)

// Mode chooses whether a restore prefetches.
type Mode string

const (
	// ModeAuto prefetches when consume_enabled is on and a valid manifest exists.
	ModeAuto Mode = "auto"
	// ModeOn prefetches whenever a valid manifest exists.
	ModeOn Mode = "on"
	// ModeOff never prefetches.
	ModeOff Mode = "off"
)

// ParseMode reads a --prefetch value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeOn, ModeOff:
		return m, nil
	}
	return "", fmt.Errorf("prefetch mode %q: want auto, on or off", s)
}

// Source is what a restore needs from the repository. Resolving it is not
// part of a restore (nor of its timing).
type Source struct {
	SnapshotID   string        `json:"snapshot_id"`
	VMStatePath  string        `json:"vm_state_path"`
	Layout       layout.Layout `json:"layout"`
	ManifestPath string        `json:"manifest_path,omitempty"`
	// Manifest is the descriptor the record carries; nil when none is attached.
	Manifest *manifest.Descriptor `json:"manifest,omitempty"`
	// Memory is the snapshot's memory, which the device serves: a local
	// file (memdev.File) or a remote store's (repository.MemorySource);
	// required. What it can do besides serving bytes, the restore asks
	// for with capability interfaces (source.go).
	Memory memdev.Source `json:"-"`
	// VMStateSize and VMStateSHA256 are what the record says of the VMM
	// state file; the restore checks it before the VMM reads it.
	VMStateSize   int64  `json:"vm_state_size"`
	VMStateSHA256 string `json:"vm_state_sha256"`
	// Digests and DigestsPath are the memory file's table of CRC-32C
	// digests, SHA256Digests and SHA256DigestsPath its table of SHA-256
	// digests; the memory device checks every block against one of them
	// (see verify.go).
	Digests     *repository.DigestsDescriptor `json:"digests,omitempty"`
	DigestsPath string                        `json:"digests_path,omitempty"`

	SHA256Digests     *repository.DigestsDescriptor `json:"sha256_digests,omitempty"`
	SHA256DigestsPath string                        `json:"sha256_digests_path,omitempty"`
	// Refinement and RefinementPath are the learned manifest (refined.go);
	// nil and "" when the snapshot has none.
	Refinement     *repository.RefinementDescriptor `json:"refinement,omitempty"`
	RefinementPath string                           `json:"refinement_path,omitempty"`
	// Gone, when set, says whether the snapshot was deleted since it was
	// resolved (DeletedFrom): a file missing then went with it, while one
	// missing from a snapshot still there is damage. Nil: a missing file
	// is damage.
	Gone func() bool `json:"-"`
	// Record is the record the source was made from (SourceOf); nil for
	// one made without a record (tests of the device alone). The restore
	// checks it before any memory is served (verify.go).
	Record *repository.Record `json:"record,omitempty"`
}

// SourceOf adapts a resolved repository record.
func SourceOf(r repository.Resolved) Source {
	s := Source{
		SnapshotID:   r.Record.ID,
		VMStatePath:  r.VMStatePath,
		Layout:       r.Record.Layout,
		ManifestPath: r.ManifestPath,
		Memory:       r.MemorySource(),

		VMStateSize:   r.Record.VMStateSize,
		VMStateSHA256: r.Record.VMStateSHA256,
		Digests:       r.Record.MemoryDigests,
		DigestsPath:   r.DigestsPath,

		SHA256Digests:     r.Record.MemorySHA256Digests,
		SHA256DigestsPath: r.SHA256DigestsPath,

		Refinement:     r.Record.Refinement,
		RefinementPath: r.RefinementPath,

		Record: &r.Record,
	}
	if d := r.Record.Manifest; d != nil {
		s.Manifest = &manifest.Descriptor{SHA256: d.SHA256, Size: d.Size}
	}
	return s
}

// Options choose how one restore runs.
type Options struct {
	// Device is the kind of memory device (memdev.Opener.Kind); the
	// restorer's first when empty.
	Device   string
	IOEngine int
	Prefetch Mode
	Policy   Policy
	// Trace records the device's first touches until ready (the recorder).
	Trace bool
	// DeviceKey names the FUSE device the restore shares; the snapshot id
	// when empty. The recorder uses a private key so that no other VM's
	// cached pages hide touches from its trace.
	DeviceKey string
	// Touched, when set, says which pages brought into the guest's reach
	// it touched (a device-specific probe); the restore's Observation
	// then counts exactly those. Nil: on the file device, the VMM
	// process's page tables at ready (package residency); elsewhere the
	// device's own view (refine).
	Touched refine.Touched `json:"-"`
	// Unverified serves memory without checking it against the snapshot's
	// digest table: the lab's +noverify columns, which measure what
	// verification costs. The request layer never sets it.
	Unverified bool `json:"-"`
}

// Restorer restores snapshots. One per process (the daemon) or per trial.
type Restorer struct {
	// Devices attach the memory devices restores run on; the first is the
	// default (Options.Device empty).
	Devices memdev.Devices
	// Engine runs prefetch tasks; shared so tasks are shared.
	Engine *prefetch.Engine
	VMM    vmm.VMM
	// ConsumeEnabled is [snapshot.memory_startup_pack] consume_enabled.
	ConsumeEnabled bool
	// Refine is [snapshot.memory_startup_pack] refine: prefetch the
	// snapshot's learned manifest when it has one (refined.go).
	Refine bool
	// RuntimeDir holds a private directory per restore.
	RuntimeDir string
	Log        *slog.Logger
	// Observe, when set, is told of each decision (for metrics).
	Observe Observer
	// Trust, when it trusts keys, refuses before anything of a snapshot
	// is read one whose record no trusted key signed (verify.go).
	Trust *trust.Policy
}

// Observer receives restore events; every method may be called concurrently.
type Observer interface {
	ManifestRejected(reason string)
	PrefetchSkipped(reason string)
	PrefetchEnded(state prefetch.State)
	Phases(t Timings)
}

// Timings are measured from the call to Restore.
type Timings struct {
	DeviceAcquired    time.Duration `json:"device_acquired_ns"`
	ManifestValidated time.Duration `json:"manifest_validated_ns"`
	VMStarted         time.Duration `json:"vm_started_ns"`
	Ready             time.Duration `json:"ready_ns"`
	// StreamStarted, StreamFirstBlock and StreamEnded are when a remote
	// memory source's startup stream (its startup pack streaming into the
	// node cache) was started, delivered its first block and ended; zero
	// when there was none or it had not by ready. They say where a cold
	// node's time goes.
	StreamStarted    time.Duration `json:"stream_started_ns,omitempty"`
	StreamFirstBlock time.Duration `json:"stream_first_block_ns,omitempty"`
	StreamEnded      time.Duration `json:"stream_ended_ns,omitempty"`
}

// LogValue makes the timings one group of durations in a structured log line.
func (t Timings) LogValue() slog.Value {
	return slog.GroupValue(slog.Duration("device_acquired", t.DeviceAcquired),
		slog.Duration("manifest_validated", t.ManifestValidated), slog.Duration("vm_started", t.VMStarted),
		slog.Duration("ready", t.Ready))
}

// PrefetchReport says what prefetch did for one restore.
type PrefetchReport struct {
	// State is "skipped", or the task state at ready: running, completed, ...
	State string `json:"state"`
	// Reason says why prefetch was skipped or failed.
	Reason string `json:"reason,omitempty"`
	// PlannedBytes is the manifest's total.
	PlannedBytes int64 `json:"planned_bytes"`
	// LeftToDemandBytes is the part of PlannedBytes the memory source
	// asked prefetch to leave to demand faults (PrefetchTrimmer: on S3,
	// pages neither its startup pack nor the node cache holds).
	LeftToDemandBytes int64 `json:"left_to_demand_bytes,omitempty"`
	// GapBytes is what the plan reads beyond the manifest: the small gaps
	// between recorded ranges it takes along (Policy.GapBytes).
	GapBytes int64 `json:"gap_bytes,omitempty"`
	// Manifest is which manifest was prefetched: ManifestRecorded or
	// ManifestRefined; empty when none was.
	Manifest string `json:"manifest,omitempty"`
	// Fallback says why the refined manifest was not used although the
	// snapshot has one and refine is on.
	Fallback string `json:"fallback,omitempty"`
	// StartupPackSkipped says why the memory source went without its
	// startup pack (missing, damaged, not matching the manifest) and read
	// the startup set from its chunks instead: the cold restore is slower.
	StartupPackSkipped string `json:"startup_pack_skipped,omitempty"`
	// Task is the shared task's key, when one ran.
	Generation uint64 `json:"generation,omitempty"`
	Digest     string `json:"digest,omitempty"`
	// EndedAfter is when the task ended, from the start of the restore,
	// if it ended before ready: prefetch that outlives ready overlapped
	// the whole restore.
	EndedAfter time.Duration `json:"ended_after_ns,omitempty"`
}

// Instance is one restored VM and everything it holds.
type Instance struct {
	ID       string
	Timings  Timings
	Prefetch PrefetchReport
	// DeviceBytes are the device counters from acquisition to ready.
	DeviceBytes memdev.Counters
	Ready       vmm.ReadyInfo
	// Trace holds the first touches until ready when Options.Trace was set.
	Trace []memdev.Touch
	// Generation is the device's number (memdev.ID.Generation): a shared
	// file device generation, or one VM's uffd session.
	Generation uint64
	// StartupSet accounts for the startup set at ready (startupset).
	StartupSet startupset.Report
	// PrefetchLabel is PrefetchLabelOn, PrefetchLabelOff or PrefetchLabelSkipped.
	PrefetchLabel string
	// Events are what the memory device served until ready, timed from
	// the start of the restore (the timeline).
	Events []startupset.Event
	// Observation is what the restore saw of the manifest it prefetched,
	// for learning (package refine); nil when it did not prefetch.
	Observation *refine.Observation

	// rec records what the device serves until ready; observer is the
	// device's observer (rec, and the prefetch task following the guest).
	rec      *startupset.Recorder
	observer *deviceObserver

	r      *Restorer
	vm     vmm.Instance
	sub    *prefetch.Subscription
	device memdev.Device
	// damage is the first damaged read of the memory the device told
	// of (damage.go).
	damage *remoteDamage
	runDir string
	// prefetchEnded is when the task was seen ending; it is set before
	// prefetchEndedCh closes.
	prefetchEnded   time.Time
	prefetchEndedCh chan struct{}
	// warm is the remote memory cache's prefetch, warmStop stops it
	// once (remote.go).
	warm     repository.CacheWarm
	warmStop func()
	// exit tracks the VM's process exiting on its own after ready (exit.go).
	exit exitWatch
	// stall is the memory source, when it reports what its store keeps
	// waiting; readsEnded is set when the stop ended the remote reads.
	stall      StallReporter
	readsEnded atomic.Bool
	stopOnce   sync.Once
	stopErr    error
}

// Restore restores src and returns once its guest is ready, in the seed's
// sequence: acquire the memory device, validate the manifest, prefetch
// alongside the VMM loading the snapshot, wait for ready. On error every
// resource it took is released.
func (r *Restorer) Restore(ctx context.Context, src Source, opts Options) (*Instance, error) {
	t0 := time.Now()
	opts = opts.withDefaults()
	if err := r.checkTrust(src); err != nil {
		return nil, fmt.Errorf("restore %s: %w", src.SnapshotID, err)
	}
	inst, err := r.newInstance(src)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", src.SnapshotID, err)
	}
	if err := inst.run(ctx, t0, src, opts); err != nil {
		err = fmt.Errorf("restore %s: %w", src.SnapshotID, err)
		inst.abandon(err)
		return nil, err
	}
	if r.Observe != nil {
		r.Observe.Phases(inst.Timings)
	}
	inst.watchExit()
	return inst, nil
}

// withDefaults fills in the default policy.
func (o Options) withDefaults() Options {
	if o.Policy.Name == "" {
		o.Policy, _ = LookupPolicy(DefaultPolicy)
	}
	return o
}

var restoreSeq atomic.Uint64

func (r *Restorer) newInstance(src Source) (*Instance, error) {
	id := fmt.Sprintf("%s-%d-%d", shortID(src.SnapshotID), os.Getpid(), restoreSeq.Add(1))
	inst := &Instance{ID: id, r: r, runDir: filepath.Join(r.RuntimeDir, "restores", id)}
	if err := os.MkdirAll(inst.runDir, 0o700); err != nil {
		return nil, err
	}
	return inst, nil
}

// run is the restore sequence; its timings are measured from t0.
func (inst *Instance) run(ctx context.Context, t0 time.Time, src Source, opts Options) error {
	inst.rec = startupset.NewRecorder(t0)
	inst.stall, _ = src.Memory.(StallReporter)
	inst.observer = newDeviceObserver(inst.rec)
	op, err := inst.r.Devices.Opener(opts.Device)
	if err != nil {
		return err
	}
	// 0. Start the wire first: a remote source's startup pack streams
	// into the node cache while the rest of the sequence runs.
	if inst.streamStartup(src, opts, op) {
		inst.Timings.StreamStarted = time.Since(t0)
	}
	// 1. Acquire the memory device, checked against the digest table.
	if err := inst.acquire(src, opts, op); err != nil {
		return err
	}
	base := inst.device.Counters()
	inst.Timings.DeviceAcquired = time.Since(t0)

	// 2. Validate the manifest; any failure means on-demand reads.
	m, digest := inst.r.planPrefetch(src, opts, op, &inst.Prefetch)
	inst.Timings.ManifestValidated = time.Since(t0)
	if m == nil {
		inst.stopCacheWarm() // a stream started in step 0 that nothing will use
	}

	// 3. Prefetch concurrently with the VMM loading the snapshot.
	if err := inst.startVM(ctx, src, opts, prefetchPlan{m, digest}); err != nil {
		return err
	}
	inst.Timings.VMStarted = time.Since(t0)

	// 4. Wait for ready, watching the device: if it stops serving, the
	// guest would hang on its next fault, so the VM is stopped instead.
	if err := inst.waitReady(ctx, t0, src.SnapshotID); err != nil {
		return inst.withMemoryState(err, src)
	}
	noteReady(src)
	inst.noteStreamArrival(t0)
	inst.DeviceBytes = inst.device.Counters().Sub(base)
	inst.reportPrefetch(t0)
	inst.notePackSkipped(src)
	if t, ok := inst.device.(memdev.Tracer); ok && opts.Trace {
		inst.Trace = t.StopTrace()
	}
	inst.account(src, m, op.Kind(), opts)
	return nil
}

// Share is another reference to the restore's device generation, which
// outlives the restore (the daemon's hold, which reads its counters
// across restores and releases it on its own); memdev.ErrNotShared when
// the device is this VM's alone (memdev.Sharer).
func (inst *Instance) Share() (memdev.Device, error) {
	if s, ok := inst.device.(memdev.Sharer); ok {
		return s.Share()
	}
	return nil, memdev.ErrNotShared
}

// acquire checks the VMM state file and attaches the memory device.
func (inst *Instance) acquire(src Source, opts Options, op memdev.Opener) error {
	r := inst.r
	if err := r.checkVMState(src); err != nil {
		return err
	}
	digests, err := r.loadDigests(src, opts)
	if err != nil {
		return err
	}
	inst.damage = r.remoteDamageOf(src)
	req := inst.request(src, opts)
	req.Verifier = r.verifier(src, digests)
	req.Prefetching = r.meansToPrefetch(src, opts, op)
	dev, err := op.Open(req)
	if err != nil {
		return fmt.Errorf("attach memory device: %w", integrityIf(err))
	}
	inst.device = dev
	inst.Generation = dev.ID().Generation
	return nil
}

// request is what the restore asks of its device: src's memory, shared
// under the snapshot's key (or opts.DeviceKey), observed by the restore,
// its failed reads noted as damage.
func (inst *Instance) request(src Source, opts Options) memdev.Request {
	key := opts.DeviceKey
	if key == "" {
		key = src.SnapshotID
	}
	req := memdev.Request{Key: key, Memory: src.Memory, Observer: inst.observer,
		Trace: opts.Trace, IOEngine: opts.IOEngine, RunDir: inst.runDir}
	if inst.damage != nil {
		req.OnReadError = inst.damage.note
	}
	return req
}

// prefetchPlan is a validated manifest and its digest; m is nil when the
// restore does not prefetch.
type prefetchPlan struct {
	m      *manifest.Manifest
	digest string
}

// startVM starts the VMM with prefetch alongside it: before it where the
// device serves already, once the VMM has connected where the device
// waits for it (memdev.Connecter). A policy that prefetches before the
// guest runs has the VM restored paused and resumed once every range is
// in.
func (inst *Instance) startVM(ctx context.Context, src Source, opts Options, pp prefetchPlan) error {
	dev := inst.device
	conn, connects := dev.(memdev.Connecter)
	paused := pp.m != nil && opts.Policy.BeforeStart
	if pp.m != nil && !connects {
		if err := inst.startPrefetch(ctx, src, opts.Policy, pp, paused); err != nil {
			return err
		}
		paused = false
	}
	spec := vmm.RestoreSpec{SnapshotID: src.SnapshotID, VMStatePath: src.VMStatePath, Layout: src.Layout,
		RuntimeDir: inst.runDir, Paused: paused}
	if err := dev.Configure(ctx, &spec); err != nil {
		return fmt.Errorf("configure memory device: %w", err)
	}
	vm, err := inst.r.VMM.Restore(ctx, spec)
	if err != nil {
		return startError(ctx, conn, err)
	}
	inst.vm = vm
	if connects {
		if err := conn.Connect(ctx, vm); err != nil {
			return err
		}
		if pp.m != nil {
			if err := inst.startPrefetch(ctx, src, opts.Policy, pp, paused); err != nil {
				return err
			}
		}
	}
	if paused {
		return resume(vm)
	}
	return nil
}

// startError is the error of a VMM that failed to start, led by the
// device's own failure when the device stopped serving it first.
func startError(ctx context.Context, conn memdev.Connecter, err error) error {
	if conn != nil {
		if derr := conn.Connect(ctx, nil); derr != nil {
			return fmt.Errorf("%w; then start VMM: %w", derr, err)
		}
	}
	return fmt.Errorf("start VMM: %w", err)
}

func resume(vm vmm.Instance) error {
	res, ok := vm.(vmm.Resumer)
	if !ok {
		return errors.New("VMM cannot resume a paused restore")
	}
	if err := res.Resume(); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	return nil
}

// startPrefetch joins the prefetch task of the device and manifest, and
// with wait, waits for it to finish. A device that cannot prefetch means
// on-demand reads, with a log line.
func (inst *Instance) startPrefetch(ctx context.Context, src Source, p Policy, pp prefetchPlan, wait bool) error {
	trimmed, trims := prefetchable(src, pp.m)
	// A source that trims keeps prefetch to what it holds cheaply: no gaps.
	plan := p.Plan(trimmed, !trims)
	inst.Prefetch.PlannedBytes = pp.m.TotalBytes()
	inst.Prefetch.LeftToDemandBytes = pp.m.TotalBytes() - trimmed.TotalBytes()
	inst.Prefetch.Generation, inst.Prefetch.Digest = inst.Generation, pp.digest
	inst.startCacheWarm(src, pp.m)
	target, onEnd, err := inst.device.Target(plan, memdev.TargetOptions{Fill: p.Fill, Hint: p.Hint})
	if err != nil {
		inst.r.skip(&inst.Prefetch, src.SnapshotID, err.Error())
		return nil
	}
	id := inst.device.ID()
	key := prefetch.Key{Device: id.Kind, Generation: id.Generation, Digest: pp.digest}
	inst.sub = inst.r.Engine.Join(key, target, plan, p.TaskOptions())
	if !trims {
		// The task joined may be another restore's, with its own plan.
		inst.Prefetch.GapBytes = max(0, inst.sub.PlanBytes()-trimmed.TotalBytes())
	}
	inst.observer.startFollowing(inst.sub)
	// When Join found a running task, target is unused and onEnd frees it
	// with that task.
	inst.watchPrefetch(onEnd)
	if wait {
		if err := inst.sub.Wait(ctx); err != nil && ctx.Err() != nil {
			return fmt.Errorf("prefetch before start: %w", err)
		}
	}
	return nil
}

// reportPrefetch records, at ready, the task's state and when it ended.
func (inst *Instance) reportPrefetch(t0 time.Time) {
	if inst.sub == nil {
		return
	}
	select {
	case <-inst.prefetchEndedCh:
		inst.Prefetch.EndedAfter = inst.prefetchEnded.Sub(t0)
	default:
	}
	inst.Prefetch.State = inst.sub.State().String()
	if err := inst.sub.Err(); err != nil {
		inst.Prefetch.Reason = err.Error()
	}
}

// abandon releases what a failed restore took. A VM whose device can no
// longer serve it is killed first: it could not act on a stop request.
// The remote reads it waits on end at once (with why, the restore's
// error), not after the stop's grace: nothing wants their bytes.
func (inst *Instance) abandon(why error) {
	if inst.device != nil {
		stopObserving(inst.device)
		endReads(inst.device, errStopped(inst.ID, why))
	}
	if inst.vm != nil && inst.device != nil && closed(inst.device.Done()) {
		if k, ok := inst.vm.(killer); ok {
			k.Kill()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inst.Stop(ctx)
}

// killer is implemented by VMM instances that can be ended at once.
type killer interface{ Kill() }

// waitReady waits for the guest agent, or for the device to stop serving,
// and records the time to ready.
func (inst *Instance) waitReady(ctx context.Context, t0 time.Time, snapshot string) error {
	ready, err := waitReady(ctx, inst.vm, inst.device)
	if err != nil {
		return inst.explain(snapshot, err)
	}
	inst.Timings.Ready = time.Since(t0)
	if !ready.Ready.IsZero() && ready.Ready.After(t0) {
		// The driver saw the guest become ready; what it did after that
		// (the replay VMM hashes what it read) is not the guest's time.
		inst.Timings.Ready = ready.Ready.Sub(t0)
	}
	inst.Ready = ready
	return nil
}

func waitReady(ctx context.Context, vm vmm.Instance, dev memdev.Device) (vmm.ReadyInfo, error) {
	gone := dev.Done()
	if gone == nil {
		return vm.WaitReady(ctx)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		info vmm.ReadyInfo
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		info, err := vm.WaitReady(wctx)
		ch <- result{info, err}
	}()
	select {
	case res := <-ch:
		return res.info, res.err
	case <-gone:
		vm.RequestStop()
		cancel()
		<-ch
		return vmm.ReadyInfo{}, fmt.Errorf("page-fault handler stopped before ready; VM stopped: %w", dev.Err())
	}
}

// explain names what the device saw when the VM failed: the bad block it
// refused to serve (the VM died on a page it could not have), or the
// damaged read of the memory's store.
func (inst *Instance) explain(snapshot string, err error) error {
	if c := corruption(inst.device); c != nil && !errors.Is(err, integrity.ErrCorrupt) {
		return markIntegrity(fmt.Errorf("snapshot %s: memory %w (%w)", snapshot, c, err))
	}
	if c := inst.damage.err(); c != nil && !errors.Is(err, repository.ErrIntegrity) {
		return markIntegrity(fmt.Errorf("snapshot %s: memory: %w (%w)", snapshot, c, err))
	}
	return integrityIf(err)
}

// corruption is the first bad block dev met, if it keeps one.
func corruption(dev memdev.Device) error {
	if c, ok := dev.(memdev.CorruptionReporter); ok {
		return c.Corruption()
	}
	return nil
}

// closed reports whether ch is closed; a nil ch never closes.
func closed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// meansToPrefetch says, before the device is acquired, whether the
// restore will prefetch if its manifest then validates: what planPrefetch
// decides without reading the manifest.
func (r *Restorer) meansToPrefetch(src Source, opts Options, op memdev.Opener) bool {
	switch {
	case opts.Prefetch == ModeOff, opts.Prefetch == ModeAuto && !r.ConsumeEnabled, src.Manifest == nil:
		return false
	}
	return cannotPrefetch(op, opts) == nil
}

// cannotPrefetch is why op's devices cannot prefetch a restore with
// opts (memdev.PrefetchChecker), nil when they can.
func cannotPrefetch(op memdev.Opener, opts Options) error {
	if c, ok := op.(memdev.PrefetchChecker); ok {
		return c.CheckPrefetch(memdev.Request{IOEngine: opts.IOEngine})
	}
	return nil
}

// planPrefetch decides whether this restore prefetches and returns the
// validated manifest and its digest, or nil with the reason in rep.
func (r *Restorer) planPrefetch(src Source, opts Options, op memdev.Opener, rep *PrefetchReport) (*manifest.Manifest, string) {
	switch {
	case opts.Prefetch == ModeOff:
		r.skipQuiet(rep, "prefetch off")
		return nil, ""
	case opts.Prefetch == ModeAuto && !r.ConsumeEnabled:
		r.skipQuiet(rep, "consume_enabled is off")
		return nil, ""
	case src.Manifest == nil:
		r.skipQuiet(rep, "snapshot has no startup manifest")
		return nil, ""
	case cannotPrefetch(op, opts) != nil:
		r.skip(rep, src.SnapshotID, cannotPrefetch(op, opts).Error())
		return nil, ""
	}
	if m, digest := r.refinedManifest(src, rep); m != nil {
		return m, digest
	}
	data, err := manifest.ReadFile(src.ManifestPath)
	if err == nil {
		var m *manifest.Manifest
		m, err = manifest.Verify(data, *src.Manifest, src.Layout)
		if err == nil {
			rep.Manifest = ManifestRecorded
			return m, src.Manifest.SHA256
		}
	}
	reason := reasonOf(err)
	if r.Observe != nil {
		r.Observe.ManifestRejected(reason)
	}
	r.skip(rep, src.SnapshotID, fmt.Sprintf("manifest rejected (%s): %v", reason, err))
	return nil, ""
}

// reasonOf names a manifest validation failure for logs and metrics.
func reasonOf(err error) string {
	for _, c := range []struct {
		err  error
		name string
	}{
		{os.ErrNotExist, "missing"},
		{fsx.ErrNotRegular, "not_regular"},
		{manifest.ErrSizeMismatch, "size"},
		{manifest.ErrDigestMismatch, "digest"},
		{manifest.ErrLayoutMismatch, "layout"},
		{manifest.ErrOversize, "oversize"},
	} {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	for _, format := range []error{
		manifest.ErrTruncated, manifest.ErrTrailingData, manifest.ErrBadMagic, manifest.ErrUnsupportedVersion,
		manifest.ErrOverlap, manifest.ErrUnaligned, manifest.ErrOutsideLayout, layout.ErrInvalid,
	} {
		if errors.Is(err, format) {
			return "corrupt"
		}
	}
	// Anything else failed to read the file at all (EIO, EACCES).
	return "unreadable"
}

func (r *Restorer) skipQuiet(rep *PrefetchReport, reason string) {
	rep.State, rep.Reason = "skipped", reason
	if r.Observe != nil {
		r.Observe.PrefetchSkipped(reason)
	}
}

// skip records a skip worth an operator's attention: one log line naming
// the snapshot and the reason.
func (r *Restorer) skip(rep *PrefetchReport, snapshot, reason string) {
	r.skipQuiet(rep, reason)
	if r.Log != nil {
		r.Log.Warn("startup prefetch skipped; restoring with on-demand reads", "snapshot", snapshot, "reason", reason)
	}
}

// watchPrefetch notes when the task ends, then runs onEnd.
func (inst *Instance) watchPrefetch(onEnd func()) {
	inst.prefetchEndedCh = make(chan struct{})
	go func() {
		<-inst.sub.Done()
		inst.prefetchEnded = time.Now()
		close(inst.prefetchEndedCh)
		if onEnd != nil {
			onEnd()
		}
	}()
}
