package restore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/vmm"
)

// stopReadGrace is how long the stop of a restore that got ready lets
// the reads of its memory in progress complete before it ends them
// (memdev.ReadScope): a healthy store answers well within it, and a
// stalled one costs no more than this.
const stopReadGrace = 500 * time.Millisecond

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

// Stop shuts the instance down in the seed's order and is safe to call
// more than once:
//  1. request that the VM stop, so no new faults arrive;
//  2. leave the prefetch task and wait for its reads to exit (a read
//     blocked in the kernel cannot be interrupted; other consumers keep
//     the task running);
//  3. wait for the VMM to exit, keeping the device reference all along;
//  4. release the device and wait for its acknowledgement that no read
//     is in flight.
func (inst *Instance) Stop(ctx context.Context) error {
	inst.stopOnce.Do(func() { inst.stopErr = inst.stop(ctx, nil) })
	return inst.stopErr
}

// StopReported is Stop returning the shutdown's timings.
func (inst *Instance) StopReported(ctx context.Context) (StopReport, error) {
	var rep StopReport
	inst.stopOnce.Do(func() { inst.stopErr = inst.stop(ctx, &rep) })
	return rep, inst.stopErr
}

func (inst *Instance) stop(ctx context.Context, rep *StopReport) error {
	if rep == nil {
		rep = new(StopReport)
	}
	inst.beginStop()
	if inst.observer != nil {
		inst.observer.stopFollowing()
	}
	if st, ok := inst.Exit(); ok {
		rep.Exit = &st
	}
	// The seed's order: stop the VM, wait for the prefetch reads, wait for
	// the VMM to exit, then release the device. Remote reads still waiting
	// after a grace are ended meanwhile: the VMM cannot exit, nor the
	// prefetch reads drain, while the store keeps them.
	endReads := inst.endReadsAfter(stopReadGrace)
	errs := inst.requestVMStop()
	errs = append(errs, inst.drainPrefetch(ctx, rep)...)
	if inst.vm != nil {
		if err := inst.waitError(inst.vm.Wait(ctx)); err != nil {
			errs = append(errs, inst.withEndedReads(err))
		}
	}
	endReads() // the VM is gone: nothing of this restore reads any more
	errs = append(errs, inst.releaseDevice(ctx, rep)...)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop restore %s: %w", inst.ID, err)
	}
	return nil
}

// endReadsAfter ends the device's remote reads for this restore once
// grace has passed, or when the returned function is called, whichever
// comes first.
func (inst *Instance) endReadsAfter(grace time.Duration) func() {
	if inst.device == nil {
		return func() {}
	}
	end := sync.OnceFunc(func() {
		if endReads(inst.device, errStopped(inst.ID, inst.unanswered())) {
			inst.readsEnded.Store(true)
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
func (inst *Instance) withEndedReads(err error) error {
	if !inst.readsEnded.Load() {
		return err
	}
	if why := inst.unanswered(); why != nil {
		return fmt.Errorf("%w (the stop ended the VM's memory reads: %w)", err, why)
	}
	return fmt.Errorf("%w (the stop ended the VM's memory reads, which had not completed)", err)
}

// requestVMStop asks the VM to stop, then stops the remote memory cache's
// prefetch: its GETs are cancelled at once, and device reads waiting on
// them fetch for themselves.
func (inst *Instance) requestVMStop() []error {
	var errs []error
	if inst.vm != nil {
		if err := inst.vm.RequestStop(); err != nil {
			errs = append(errs, fmt.Errorf("request VM stop: %w", err))
		}
	}
	inst.stopCacheWarm()
	return errs
}

// drainPrefetch leaves the prefetch task and waits for its reads.
func (inst *Instance) drainPrefetch(ctx context.Context, rep *StopReport) []error {
	if inst.sub == nil {
		return nil
	}
	var errs []error
	t := time.Now()
	if err := inst.sub.LeaveWait(ctx); err != nil {
		errs = append(errs, err)
	}
	rep.PrefetchDrain = time.Since(t)
	if inst.r.Observe != nil {
		inst.r.Observe.PrefetchEnded(inst.sub.State())
	}
	return errs
}

// releaseDevice releases the memory device, timing the acknowledgement,
// and removes the restore's runtime directory.
func (inst *Instance) releaseDevice(ctx context.Context, rep *StopReport) []error {
	var errs []error
	t := time.Now()
	if inst.device != nil {
		last, err := inst.device.Release(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		if last {
			inst.forgetPrefetch()
		}
	}
	rep.ReleaseAck = time.Since(t)
	if inst.runDir != "" {
		if err := os.RemoveAll(inst.runDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// waitError is the stop's error for what the VMM's Wait returned: nil
// when Wait succeeded or only tells again of an exit after ready that is
// already reported (drivers report an exit nobody asked for as an error).
func (inst *Instance) waitError(err error) error {
	if err == nil {
		return nil
	}
	if _, exited := inst.Exit(); exited {
		if inst.r.Log != nil {
			inst.r.Log.Info("reaped a VM that had exited after ready", "restore", inst.ID, "detail", err.Error())
		}
		return nil
	}
	return fmt.Errorf("wait for VM exit: %w", err)
}

// forgetPrefetch drops the prefetch tasks of the instance's device once no
// restore can join them again, so a daemon does not keep every task it
// ever ran.
func (inst *Instance) forgetPrefetch() {
	if inst.r.Engine != nil {
		id := inst.device.ID()
		inst.r.Engine.Forget(id.Kind, id.Generation)
	}
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[len(id)-8:]
	}
	return id
}
