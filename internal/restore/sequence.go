package restore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/repository"
	"warmstart/internal/vmm"
)

// sequence is one restore in progress: the seed's steps, in order, and
// what each found. It lives only inside Restorer.Restore, which hands its
// holdings to the Instance on success and stops with them on failure.
type sequence struct {
	r     *Restorer
	src   Source
	opts  Options
	op    memdev.Opener
	t0    time.Time
	inst  *Instance
	held  *holdings
	guest *guest
	plan  prefetchPlan
	// warm is the memory source's cache prefetch (cachewarm.go); damage
	// the first damaged read of the memory the device told of (damage.go).
	warm   repository.CacheWarm
	damage *remoteDamage
	// cost is the node's reading at t0 (cost.go).
	cost costMeter
}

var restoreSeq atomic.Uint64

// newSequence makes the restore's private directory and what it will hold.
func (r *Restorer) newSequence(t0 time.Time, src Source, opts Options) (*sequence, error) {
	id := fmt.Sprintf("%s-%d-%d", shortID(src.SnapshotID), os.Getpid(), restoreSeq.Add(1))
	runDir := filepath.Join(r.RuntimeDir, "restores", id)
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return nil, err
	}
	g := newGuest(t0)
	exit := &exitWatch{id: id, log: r.Log, observe: r.Observe}
	held := &holdings{id: id, log: r.Log, observe: r.Observe, engine: r.Engine, runDir: runDir, exit: exit,
		unfollow: g.observer.stopFollowing}
	held.stall, _ = repository.Capabilities(src.Memory).(StallReporter)
	inst := &Instance{ID: id, held: held, exit: exit, pause: &pauseState{base: src.SnapshotID, pausable: opts.Pausable}}
	return &sequence{r: r, src: src, opts: opts, t0: t0, inst: inst, held: held, guest: g, cost: startCost()}, nil
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[len(id)-8:]
	}
	return id
}

// since is the time since the restore began.
func (s *sequence) since() time.Duration { return time.Since(s.t0) }

// run is the restore sequence; its timings are measured from t0.
func (s *sequence) run(ctx context.Context) error {
	op, err := s.r.Devices.Opener(s.opts.Device)
	if err != nil {
		return err
	}
	s.op = op
	// 0. Start the wire first: a remote source's startup pack streams
	// into the node cache while the rest of the sequence runs.
	if s.streamStartup() {
		s.inst.Timings.StreamStarted = s.since()
	}
	// 1. Acquire the memory device, checked against the digest table.
	if err := s.acquire(); err != nil {
		return err
	}
	base := s.held.dev.Counters()
	s.inst.Timings.DeviceAcquired = s.since()

	// 2. Validate the manifest; any failure means on-demand reads.
	s.plan = s.planPrefetch()
	s.inst.Timings.ManifestValidated = s.since()
	if s.plan.m == nil {
		s.held.stopCacheWarm() // a stream started in step 0 that nothing will use
	}

	// 3. Prefetch concurrently with the VMM loading the snapshot.
	if err := s.startVM(ctx); err != nil {
		return err
	}
	s.inst.Timings.VMStarted = s.since()

	// 4. Wait for ready, watching the device: if it stops serving, the
	// guest would hang on its next fault, so the VM is stopped instead.
	if err := s.waitReady(ctx); err != nil {
		return s.withMemoryState(err)
	}
	s.atReady(base)
	return nil
}

// atReady records what the restore found by ready; base is the device's
// counters when it was acquired.
func (s *sequence) atReady(base memdev.Counters) {
	s.inst.DeviceBytes = s.held.dev.Counters().Sub(base)
	s.inst.Cost = s.cost.atReady(s.held.vm, s.inst.DeviceBytes)
	if p, ok := s.held.dev.(memdev.Passthrougher); ok {
		s.inst.Passthrough = p.Passthrough()
	}
	noteReady(s.src)
	s.noteStreamArrival()
	s.guest.report(s.t0, &s.inst.Prefetch)
	s.notePackSkipped()
	if t, ok := s.held.dev.(memdev.Tracer); ok && s.opts.Trace {
		s.inst.Trace = t.StopTrace()
	}
	s.account(s.plan.m)
}

// acquire checks the VMM state file and attaches the memory device.
func (s *sequence) acquire() error {
	r := s.r
	if err := r.checkVMState(s.src); err != nil {
		return err
	}
	// The driver refuses another VMM's state before anything starts: here,
	// before the device is attached, so a refusal costs no mount, no
	// prefetch and no VMM process. Each driver's Restore reads the head
	// again (64 bytes): that check is the VMM's own refusal for a caller
	// that does not come through this sequence (the drivers' tests, the
	// device test suite) and is made just before the VMM loads the file.
	// Both are kept on purpose: a "checked already" flag in
	// vmm.RestoreSpec would let any caller skip the refusal, to save one
	// small read.
	if err := vmm.CheckState(r.VMM, s.src.VMStatePath); err != nil {
		return err
	}
	verifier, layerVerifiers, err := r.verifiersFor(s.src, s.opts)
	if err != nil {
		return err
	}
	s.damage = r.remoteDamageOf(s.src)
	req := s.request()
	req.Verifier, req.Verifiers = verifier, layerVerifiers
	req.Prefetching = s.meansToPrefetch()
	dev, err := s.op.Open(req)
	if err != nil {
		return fmt.Errorf("attach memory device: %w", integrityIf(err))
	}
	s.held.dev = dev
	s.inst.Generation = dev.ID().Generation
	return nil
}

// request is what the restore asks of its device: the source's memory,
// shared under the snapshot's key (or Options.DeviceKey), observed by the
// restore, its failed reads noted as damage.
func (s *sequence) request() memdev.Request {
	key := s.opts.DeviceKey
	if key == "" {
		key = s.src.SnapshotID
	}
	return memdev.Request{Key: key, Memory: s.src.Memory, Observer: s.guest.observer, OnReadError: s.damage.note,
		Trace: s.opts.Trace, IOEngine: s.opts.IOEngine, RunDir: s.held.runDir, Writable: s.writable()}
}

// writable: a pausable restore on a VMM that writes guest memory back
// (vmm.WritableMemory) needs a writable view of its device.
func (s *sequence) writable() bool {
	w, ok := s.r.VMM.(vmm.WritableMemory)
	return s.opts.Pausable && ok && w.WritableMemory()
}

// startVM starts the VMM with prefetch alongside it: before it where the
// device serves already, once the VMM has connected where the device
// waits for it (memdev.Connecter). A policy that prefetches before the
// guest runs has the VM restored paused and resumed once every range is
// in.
func (s *sequence) startVM(ctx context.Context) error {
	dev := s.held.dev
	conn, connects := dev.(memdev.Connecter)
	paused := s.plan.m != nil && s.opts.Policy.BeforeStart
	if s.plan.m != nil && !connects {
		if err := s.startPrefetch(ctx, paused); err != nil {
			return err
		}
		paused = false
	}
	spec := vmm.RestoreSpec{SnapshotID: s.src.SnapshotID, VMStatePath: s.src.VMStatePath, Layout: s.src.Layout,
		RuntimeDir: s.held.runDir, Paused: paused, Pausable: s.opts.Pausable}
	if err := dev.Configure(ctx, &spec); err != nil {
		return fmt.Errorf("configure memory device: %w", err)
	}
	vm, err := s.r.VMM.Restore(ctx, spec)
	if err != nil {
		return startError(ctx, conn, err)
	}
	s.held.vm = vm
	if connects {
		if err := conn.Connect(ctx, vm); err != nil {
			return err
		}
		if s.plan.m != nil {
			if err := s.startPrefetch(ctx, paused); err != nil {
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

func resume(vm vmm.VM) error {
	res, ok := vm.(vmm.Resumer)
	if !ok {
		return errors.New("VMM cannot resume a paused restore")
	}
	if err := res.Resume(); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	return nil
}

// abandon releases what a failed restore took. A VM whose device can no
// longer serve it is killed first: it could not act on a stop request.
// The remote reads it waits on end at once (with why, the restore's
// error), not after the stop's grace: nothing wants their bytes.
func (s *sequence) abandon(why error) {
	h := s.held
	if h.dev != nil {
		stopObserving(h.dev)
		endReads(h.dev, errStopped(h.id, why))
	}
	if h.vm != nil && h.dev != nil && closed(h.dev.Done()) {
		if k, ok := h.vm.(killer); ok {
			k.Kill()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.stopOnce(ctx)
}

// killer is implemented by VMM instances that can be ended at once.
type killer interface{ Kill() }
