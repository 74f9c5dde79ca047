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

	"golang.org/x/sys/unix"

	"warmstart/internal/fsx"
	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/prefetch"
	"warmstart/internal/repository"
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

// Device kinds.
const (
	DeviceFile = "file"
	DeviceUffd = "uffd"
)

// Source is what a restore needs from the repository. Resolving it is not
// part of a restore (nor of its timing).
type Source struct {
	SnapshotID   string
	VMStatePath  string
	MemoryPath   string
	Layout       layout.Layout
	ManifestPath string
	// Manifest is the descriptor the record carries; nil when none is attached.
	Manifest *manifest.Descriptor
	// Memory, when set, serves the memory instead of MemoryPath (snapshots
	// in a remote repository; see remote.go).
	Memory repository.MemorySource `json:"-"`
	// VMStateSize and VMStateSHA256 are what the record says of the VMM
	// state file; the restore checks it before the VMM reads it.
	VMStateSize   int64
	VMStateSHA256 string
	// Digests and DigestsPath are the memory file's digest table; the
	// memory device checks every block against it (see verify.go).
	Digests     *repository.DigestsDescriptor
	DigestsPath string
}

// SourceOf adapts a resolved repository record.
func SourceOf(r repository.Resolved) Source {
	s := Source{
		SnapshotID:   r.Record.ID,
		VMStatePath:  r.VMStatePath,
		MemoryPath:   r.MemoryPath,
		Layout:       r.Record.Layout,
		ManifestPath: r.ManifestPath,
		Memory:       r.Memory,

		VMStateSize:   r.Record.VMStateSize,
		VMStateSHA256: r.Record.VMStateSHA256,
		Digests:       r.Record.MemoryDigests,
		DigestsPath:   r.DigestsPath,
	}
	if d := r.Record.Manifest; d != nil {
		s.Manifest = &manifest.Descriptor{SHA256: d.SHA256, Size: d.Size}
	}
	return s
}

// Options choose how one restore runs.
type Options struct {
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
}

// Restorer restores snapshots. One per process (the daemon) or per trial.
type Restorer struct {
	// FUSE serves file devices; required for Device "file".
	FUSE *fusedev.Server
	// Engine runs prefetch tasks; shared so tasks are shared.
	Engine *prefetch.Engine
	VMM    vmm.VMM
	// ConsumeEnabled is [snapshot.memory_startup_pack] consume_enabled.
	ConsumeEnabled bool
	// RuntimeDir holds a private directory per restore.
	RuntimeDir string
	Log        *slog.Logger
	// Observe, when set, is told of each decision (for metrics).
	Observe Observer
	// ConnectTimeout bounds how long a restore on the uffd device waits
	// for its VMM to connect to the page-fault handler;
	// uffd.DefaultConnectTimeout when zero. A VMM that exits first ends
	// the wait at once.
	ConnectTimeout time.Duration

	// SkipVerification serves memory without checking it against the
	// snapshot's digest table. It exists to measure what verification
	// costs (the benchmark) and is never set by the daemon or the CLI.
	SkipVerification bool

	// sessionHook, set by tests, is called with each uffd session as soon
	// as it is accepted.
	sessionHook func(*uffd.Session)
}

// generationRefs counts restores' references to each FUSE generation, so
// that the engine forgets a generation's ended tasks once the last is gone
// and a daemon does not keep every task it ever ran. Generations are
// numbered per server, hence the key.
var generationRefs struct {
	sync.Mutex
	m map[generationKey]int
}

type generationKey struct {
	srv *fusedev.Server
	gen uint64
}

func (r *Restorer) holdGeneration(gen uint64) {
	generationRefs.Lock()
	defer generationRefs.Unlock()
	if generationRefs.m == nil {
		generationRefs.m = make(map[generationKey]int)
	}
	generationRefs.m[generationKey{r.FUSE, gen}]++
}

// dropGeneration is called once a reference's release is acknowledged.
func (r *Restorer) dropGeneration(gen uint64) {
	k := generationKey{r.FUSE, gen}
	generationRefs.Lock()
	generationRefs.m[k]--
	last := generationRefs.m[k] <= 0
	if last {
		delete(generationRefs.m, k)
	}
	generationRefs.Unlock()
	if last && r.Engine != nil {
		r.Engine.Forget(gen)
	}
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
}

// PrefetchReport says what prefetch did for one restore.
type PrefetchReport struct {
	// State is "skipped", or the task state at ready: running, completed, ...
	State string `json:"state"`
	// Reason says why prefetch was skipped or failed.
	Reason string `json:"reason,omitempty"`
	// PlannedBytes is the manifest's total.
	PlannedBytes int64 `json:"planned_bytes"`
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
	// Generation is the device generation (file) or session number (uffd).
	Generation uint64

	r        *Restorer
	vm       vmm.Instance
	sub      *prefetch.Subscription
	dev      *fusedev.Device
	handler  *uffd.Handler
	session  *uffd.Session
	counters func() memdev.Counters
	runDir   string
	// prefetchEnded is when the task was seen ending; it is set before
	// prefetchEndedCh closes.
	prefetchEnded   time.Time
	prefetchEndedCh chan struct{}
	// warmStop stops the remote memory cache's prefetch (remote.go).
	warmStop func()
	// unlinkSocket removes the short link to a deep runtime directory
	// that the uffd socket path may need (sockpath.go).
	unlinkSocket func()
	// exit tracks the VM's process exiting on its own after ready (exit.go).
	exit     exitWatch
	stopOnce sync.Once
	stopErr  error
}

// uffdSessions numbers uffd sessions: prefetch on the uffd device is per VM.
var uffdSessions atomic.Uint64

// uffdKeySpace sets the prefetch keys of uffd sessions apart from FUSE
// device generations. Both are numbered from 1 and share one Engine, and a
// task that installs into one VM must never be joined by a restore on the
// file device, nor the reverse.
const uffdKeySpace = 1 << 63

var restoreSeq atomic.Uint64

// Restore restores src and returns once its guest is ready. On error every
// resource it took is released.
func (r *Restorer) Restore(ctx context.Context, src Source, opts Options) (inst *Instance, err error) {
	t0 := time.Now()
	if opts.Device == "" {
		opts.Device = DeviceFile
	}
	if opts.Policy.Name == "" {
		opts.Policy, _ = LookupPolicy(DefaultPolicy)
	}
	id := fmt.Sprintf("%s-%d-%d", shortID(src.SnapshotID), os.Getpid(), restoreSeq.Add(1))
	inst = &Instance{ID: id, r: r}
	inst.runDir = filepath.Join(r.RuntimeDir, "restores", id)
	if err := os.MkdirAll(inst.runDir, 0o700); err != nil {
		return nil, fmt.Errorf("restore %s: %w", src.SnapshotID, err)
	}
	// The return statements below set inst to nil before this runs, so the
	// cleanup holds its own reference.
	self := inst
	defer func() {
		if err != nil {
			self.killIfHandlerGone()
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			self.Stop(sctx)
			inst = nil
		}
	}()

	// 1. Acquire the memory device, checked against the digest table.
	if err := r.checkVMState(src); err != nil {
		return nil, err
	}
	digests, err := r.loadDigests(src)
	if err != nil {
		return nil, err
	}
	var markHandlerGone func()
	spec := vmm.RestoreSpec{SnapshotID: src.SnapshotID, VMStatePath: src.VMStatePath, Layout: src.Layout, RuntimeDir: inst.runDir}
	switch opts.Device {
	case DeviceFile:
		if r.FUSE == nil {
			return nil, fmt.Errorf("restore %s: file device: no FUSE server", src.SnapshotID)
		}
		key := opts.DeviceKey
		if key == "" {
			key = src.SnapshotID
		}
		dev, err := r.attachFileDevice(key, src, opts.IOEngine, r.fileVerifier(src, digests))
		if err != nil {
			return nil, fmt.Errorf("restore %s: attach memory device: %w", src.SnapshotID, integrityIf(err))
		}
		inst.dev = dev
		inst.Generation = dev.Generation()
		r.holdGeneration(inst.Generation)
		inst.counters = dev.Counters
		if opts.IOEngine == fusedev.IOEngineDirect {
			if err := fusedev.CheckMappable(dev.Path()); err != nil {
				return nil, fmt.Errorf("restore %s: %w", src.SnapshotID, err)
			}
		}
		if opts.Trace {
			dev.StartTrace()
		}
		spec.Backend, spec.MemPath = vmm.BackendFile, dev.Path()
	case DeviceUffd:
		if err := checkDevice(src, opts.Device); err != nil {
			return nil, err
		}
		sock, unlink, err := socketPath(inst.runDir, "uffd.sock")
		if err != nil {
			return nil, fmt.Errorf("restore %s: uffd socket: %w", src.SnapshotID, err)
		}
		inst.unlinkSocket = unlink
		h, err := uffd.Listen(sock, src.MemoryPath, r.uffdOptions(src, digests, opts.Trace))
		if err != nil {
			return nil, fmt.Errorf("restore %s: uffd handler: %w", src.SnapshotID, integrityIf(err))
		}
		inst.handler = h
		inst.Generation = uffdSessions.Add(1)
		// A driver that learns the handler stopped serving before the VM
		// was asked to stop kills the VM, which would otherwise hang on
		// its next missing page.
		gone := make(chan struct{})
		spec.HandlerDone = gone
		markHandlerGone = sync.OnceFunc(func() { close(gone) })
		inst.counters = func() memdev.Counters {
			if inst.session == nil {
				return memdev.Counters{}
			}
			return inst.session.Counters()
		}
		spec.Backend, spec.MemPath = vmm.BackendUffd, sock
	default:
		return nil, fmt.Errorf("restore %s: unknown memory device %q (want file or uffd)", src.SnapshotID, opts.Device)
	}
	base := inst.counters()
	inst.Timings.DeviceAcquired = time.Since(t0)

	// 2. Resolve and validate the manifest; any failure means on-demand reads.
	m, digest := r.planPrefetch(src, opts, &inst.Prefetch)
	inst.Timings.ManifestValidated = time.Since(t0)

	// 3. Prefetch concurrently with the VMM loading the snapshot.
	var plan []prefetch.Range
	if m != nil {
		plan = opts.Policy.Plan(m)
		inst.Prefetch.PlannedBytes = m.TotalBytes()
		inst.Prefetch.Generation, inst.Prefetch.Digest = inst.Generation, digest
	}
	spec.Paused = m != nil && opts.Policy.BeforeStart
	if m != nil && opts.Device == DeviceFile {
		// The file device exists before the VMM does, so prefetch starts first.
		if src.Memory != nil {
			inst.startCacheWarm(src, m)
		}
		if err := inst.startFilePrefetch(digest, plan, opts.Policy); err != nil {
			r.skip(&inst.Prefetch, src.SnapshotID, err.Error())
		}
		if opts.Policy.BeforeStart && inst.sub != nil {
			if err := inst.sub.Wait(ctx); err != nil && ctx.Err() != nil {
				return nil, fmt.Errorf("restore %s: prefetch before start: %w", src.SnapshotID, err)
			}
		}
		spec.Paused = false
	}
	vm, err := r.VMM.Restore(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("restore %s: start VMM: %w", src.SnapshotID, err)
	}
	inst.vm = vm
	inst.Timings.VMStarted = time.Since(t0)

	var handlerDone <-chan struct{}
	if opts.Device == DeviceUffd {
		s, err := r.acceptVMM(ctx, inst.handler, vm)
		if err != nil {
			markHandlerGone()
			return nil, fmt.Errorf("restore %s: %w", src.SnapshotID, err)
		}
		go func() {
			<-s.Done()
			markHandlerGone()
		}()
		inst.session = s
		handlerDone = s.Done()
		if r.sessionHook != nil {
			r.sessionHook(s)
		}
		if m != nil {
			if opts.Policy.Hint {
				go hintFile(src.MemoryPath, plan)
			}
			inst.sub = r.Engine.Join(prefetch.Key{Generation: uffdKeySpace | inst.Generation, Digest: digest},
				installTarget{s}, plan, opts.Policy.TaskOptions())
			inst.watchPrefetch(nil)
			if spec.Paused {
				if err := inst.sub.Wait(ctx); err != nil && ctx.Err() != nil {
					return nil, fmt.Errorf("restore %s: prefetch before start: %w", src.SnapshotID, err)
				}
			}
		}
	}
	if spec.Paused {
		res, ok := vm.(vmm.Resumer)
		if !ok {
			return nil, fmt.Errorf("restore %s: VMM cannot resume a paused restore", src.SnapshotID)
		}
		if err := res.Resume(); err != nil {
			return nil, fmt.Errorf("restore %s: resume: %w", src.SnapshotID, err)
		}
	}

	// 4. Wait for ready, watching the page-fault handler: if it dies the
	// guest would hang on its next fault, so the VM is stopped instead.
	ready, err := waitReady(ctx, vm, handlerDone, inst.session)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", src.SnapshotID, inst.withCorruption(src.SnapshotID, err))
	}
	inst.Timings.Ready = time.Since(t0)
	if !ready.Ready.IsZero() && ready.Ready.After(t0) {
		// The driver saw the guest become ready; what it did after that
		// (the replay VMM hashes what it read) is not the guest's time.
		inst.Timings.Ready = ready.Ready.Sub(t0)
	}
	inst.Ready = ready
	inst.DeviceBytes = inst.counters().Sub(base)
	if inst.sub != nil {
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
	if opts.Trace {
		if inst.dev != nil {
			inst.Trace = inst.dev.StopTrace()
		} else {
			inst.session.StopTrace()
			inst.Trace = inst.session.Trace()
		}
	}
	if r.Observe != nil {
		r.Observe.Phases(inst.Timings)
	}
	inst.watchExit()
	return inst, nil
}

// acceptVMM waits for vm to connect to the page-fault handler and hand over
// its userfaultfd. The wait ends with an error when vm exits first (with
// its exit status) or the connect timeout passes, so that a VMM that died
// during startup fails the restore at once rather than leave it waiting.
func (r *Restorer) acceptVMM(ctx context.Context, h *uffd.Handler, vm vmm.Instance) (*uffd.Session, error) {
	opts := uffd.AcceptOptions{ConnectTimeout: r.ConnectTimeout}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = uffd.DefaultConnectTimeout
	}
	exiter, _ := vm.(vmm.Exiter)
	if exiter != nil {
		opts.VMMExited = exiter.Exited()
	}
	s, err := h.AcceptWith(ctx, opts)
	switch {
	case err == nil:
		return s, nil
	case errors.Is(err, uffd.ErrExitedBeforeConnect) && exiter != nil:
		return nil, fmt.Errorf("accept the VMM's userfaultfd: %w: %s", err, exiter.ExitStatus())
	}
	return nil, fmt.Errorf("accept the VMM's userfaultfd: %w", err)
}

// killer is implemented by VMM instances that can be ended at once.
type killer interface{ Kill() }

// killIfHandlerGone kills the VM of a uffd restore whose page-fault handler
// never served it or has stopped: its next fault on a missing page blocks
// for ever, so it could not act on a stop request. Drivers that watch
// RestoreSpec.HandlerDone kill such a VM themselves.
func (inst *Instance) killIfHandlerGone() {
	if inst.vm == nil || inst.handler == nil {
		return
	}
	if inst.session != nil {
		select {
		case <-inst.session.Done():
		default:
			return
		}
	}
	if k, ok := inst.vm.(killer); ok {
		k.Kill()
	}
}

func waitReady(ctx context.Context, vm vmm.Instance, handlerDone <-chan struct{}, s *uffd.Session) (vmm.ReadyInfo, error) {
	if handlerDone == nil {
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
	case <-handlerDone:
		vm.RequestStop()
		cancel()
		<-ch
		return vmm.ReadyInfo{}, fmt.Errorf("page-fault handler stopped before ready; VM stopped: %w", s.Err())
	}
}

// planPrefetch decides whether this restore prefetches and returns the
// validated manifest and its digest, or nil with the reason in rep.
func (r *Restorer) planPrefetch(src Source, opts Options, rep *PrefetchReport) (*manifest.Manifest, string) {
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
	case opts.Device == DeviceFile && opts.IOEngine == fusedev.IOEngineDirect:
		// Device prefetch through direct I/O would bypass the very cache
		// the VMM faults from; the seed skips it and so do we.
		r.skip(rep, src.SnapshotID, "io_engine 2 (direct I/O): prefetch not validated for this engine")
		return nil, ""
	}
	data, err := manifest.ReadFile(src.ManifestPath)
	if err == nil {
		var m *manifest.Manifest
		m, err = manifest.Verify(data, *src.Manifest, src.Layout)
		if err == nil {
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

func (inst *Instance) startFilePrefetch(digest string, plan []prefetch.Range, p Policy) error {
	f, err := os.Open(inst.dev.Path())
	if err != nil {
		return fmt.Errorf("open device file for prefetch: %w", err)
	}
	// The open file also keeps the kernel's inode, which a fill stores into.
	var target prefetch.Target = fileTarget{f}
	if p.Fill {
		target = fillTarget{inst.dev}
	}
	if p.Hint {
		go hintPlan(inst.dev.Advise, plan)
	}
	inst.sub = inst.r.Engine.Join(prefetch.Key{Generation: inst.Generation, Digest: digest},
		target, plan, p.TaskOptions())
	// The file stays open until the task has ended, and a task ends only
	// once its reads have returned. When Join found a running task this file
	// is unused and closes with that task.
	inst.watchPrefetch(func() { f.Close() })
	return nil
}

// hintPlan advises storage of every range of the plan, in order. Hints
// only start reads; a failed one costs nothing but speed, so it stops the
// hinting and nothing else.
func hintPlan(advise func(off, length int64) error, plan []prefetch.Range) {
	for _, r := range plan {
		if advise(r.Offset, r.Length) != nil {
			return
		}
	}
}

// hintFile is hintPlan for a lower file the restore reaches by path (the
// uffd device): the hint goes to the file's page cache, which the handler
// reads from.
func hintFile(path string, plan []prefetch.Range) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	hintPlan(func(off, length int64) error {
		return unix.Fadvise(int(f.Fd()), off, length, unix.FADV_WILLNEED)
	}, plan)
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
