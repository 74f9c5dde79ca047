package restore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/vmm"
)

// stopReadGrace is how long the stop of a restore that got ready lets
// the reads of its memory in progress complete before it ends them
// (memdev.ReadScope): a healthy store answers well within it, and a
// stalled one costs no more than this.
const stopReadGrace = 500 * time.Millisecond

// StopReport says how the shutdown went.
type StopReport struct {
	// PrefetchDrain is how long the stop waited for prefetch reads to exit.
	PrefetchDrain time.Duration `json:"prefetch_drain_ns"`
	// ReleaseAck is how long the device release took to be acknowledged.
	ReleaseAck time.Duration `json:"release_ack_ns"`
	// Exit is how the VM's process ended when it exited on its own after
	// ready, before the stop; nil when the stop ended it.
	Exit *vmm.ProcessExit `json:"exit,omitempty"`
}

// holdings are what a restore holds until it is stopped, and the stop.
// The restore sequence fills them in as it takes each; a failed restore
// stops with what it got.
type holdings struct {
	id      string
	log     *slog.Logger
	observe Observer
	engine  *prefetch.Engine
	runDir  string
	exit    *exitWatch

	dev memdev.Device
	vm  vmm.VM
	sub *prefetch.Subscription
	// unfollow ends the routing of the guest's faults to the prefetch
	// task; stopWarm stops the memory source's cache prefetch (nil when
	// none runs); stall is the memory source, when it says what its store
	// keeps waiting.
	unfollow func()
	stopWarm func()
	stall    StallReporter

	// readsEnded is set when the stop ended the memory reads.
	readsEnded atomic.Bool
	once       sync.Once
	stopErr    error
}

// stopOnce stops, the first time it is called; every call returns that
// stop's error, and the first its report.
func (h *holdings) stopOnce(ctx context.Context) (StopReport, error) {
	var rep StopReport
	h.once.Do(func() { h.stopErr = h.stop(ctx, &rep) })
	return rep, h.stopErr
}

// stop is Instance.Stop's order: stop the VM, wait for the prefetch
// reads, wait for the VMM to exit, then release the device. Remote reads
// still waiting after a grace are ended meanwhile: the VMM cannot exit,
// nor the prefetch reads drain, while the store keeps them.
func (h *holdings) stop(ctx context.Context, rep *StopReport) error {
	h.exit.beginStop(h.vm)
	if h.unfollow != nil {
		h.unfollow()
	}
	if st, ok := h.exit.exit(); ok {
		rep.Exit = &st
	}
	endReads := h.endReadsAfter(stopReadGrace)
	errs := h.requestVMStop()
	errs = append(errs, h.drainPrefetch(ctx, rep)...)
	if h.vm != nil {
		if err := h.waitError(h.vm.Wait(ctx)); err != nil {
			errs = append(errs, h.withEndedReads(err))
		}
	}
	endReads() // the VM is gone: nothing of this restore reads any more
	errs = append(errs, h.releaseDevice(ctx, rep)...)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop restore %s: %w", h.id, err)
	}
	return nil
}

// endReadsAfter ends the device's memory reads for this restore once
// grace has passed, or when the returned function is called, whichever
// comes first.
func (h *holdings) endReadsAfter(grace time.Duration) func() {
	if h.dev == nil {
		return func() {}
	}
	end := sync.OnceFunc(func() {
		if endReads(h.dev, errStopped(h.id, h.unanswered())) {
			h.readsEnded.Store(true)
		}
	})
	t := time.AfterFunc(grace, end)
	return func() {
		t.Stop()
		end()
	}
}

// withEndedReads adds to a failure of the VM's exit that the stop ended
// its remote memory reads, which the VMM then got as errors.
func (h *holdings) withEndedReads(err error) error {
	if !h.readsEnded.Load() {
		return err
	}
	if why := h.unanswered(); why != nil {
		return fmt.Errorf("%w (the stop ended the VM's memory reads: %w)", err, why)
	}
	return fmt.Errorf("%w (the stop ended the VM's memory reads, which had not completed)", err)
}

// requestVMStop asks the VM to stop, then stops the remote memory cache's
// prefetch: its GETs are cancelled at once, and device reads waiting on
// them fetch for themselves.
func (h *holdings) requestVMStop() []error {
	var errs []error
	if h.vm != nil {
		if err := h.vm.RequestStop(); err != nil {
			errs = append(errs, fmt.Errorf("request VM stop: %w", err))
		}
	}
	h.stopCacheWarm()
	return errs
}

// stopCacheWarm cancels the cache prefetch and waits for its fetches.
func (h *holdings) stopCacheWarm() {
	if h.stopWarm != nil {
		h.stopWarm()
	}
}

// drainPrefetch leaves the prefetch task and waits for its reads.
func (h *holdings) drainPrefetch(ctx context.Context, rep *StopReport) []error {
	if h.sub == nil {
		return nil
	}
	var errs []error
	t := time.Now()
	if err := h.sub.LeaveWait(ctx); err != nil {
		errs = append(errs, err)
	}
	rep.PrefetchDrain = time.Since(t)
	if h.observe != nil {
		h.observe.PrefetchEnded(h.sub.State())
	}
	return errs
}

// releaseDevice releases the memory device, timing the acknowledgement,
// forgets its prefetch tasks once no restore can join them again (so a
// daemon does not keep every task it ever ran), and removes the restore's
// runtime directory.
func (h *holdings) releaseDevice(ctx context.Context, rep *StopReport) []error {
	var errs []error
	t := time.Now()
	if h.dev != nil {
		last, err := h.dev.Release(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		if id := h.dev.ID(); last && h.engine != nil {
			h.engine.Forget(id.Kind, id.Generation)
		}
	}
	rep.ReleaseAck = time.Since(t)
	if h.runDir != "" {
		if err := os.RemoveAll(h.runDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// waitError is the stop's error for what the VMM's Wait returned: nil
// when Wait succeeded or only tells again of an exit after ready that is
// already reported (drivers report an exit nobody asked for as an error).
func (h *holdings) waitError(err error) error {
	if err == nil {
		return nil
	}
	if _, exited := h.exit.exit(); exited {
		if h.log != nil {
			h.log.Info("reaped a VM that had exited after ready", "restore", h.id, "detail", err.Error())
		}
		return nil
	}
	return fmt.Errorf("wait for VM exit: %w", err)
}

// errStopped is the cause the reads of a device end with when its last
// restore stops or fails: a cancellation, so no read of it counts as a
// failure of the store.
func errStopped(id string, why error) error {
	if why != nil {
		return fmt.Errorf("restore %s is over (%w): %w", id, why, context.Canceled)
	}
	return fmt.Errorf("restore %s is over: %w", id, context.Canceled)
}

// endReads has dev end this restore's reads of its memory (memdev.ReadEnder)
// and reports whether that ended reads in progress.
func endReads(dev memdev.Device, cause error) bool {
	if e, ok := dev.(memdev.ReadEnder); ok {
		return e.EndReads(cause)
	}
	return false
}

// stopObserving drops the restore's observer from a device that serves on
// (memdev.ObserverRemover).
func stopObserving(dev memdev.Device) {
	if r, ok := dev.(memdev.ObserverRemover); ok {
		r.StopObserving()
	}
}
