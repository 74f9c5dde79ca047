package restore

import (
	"context"

	"warmstart/internal/memdev"
	"warmstart/internal/refine"
	"warmstart/internal/startupset"
	"warmstart/internal/vmm"
)

// Instance is one restored VM: what its restore found by the time the
// guest was ready, and what it holds until Stop.
type Instance struct {
	ID       string
	Timings  Timings
	Prefetch PrefetchReport
	// DeviceBytes are the device counters from acquisition to ready.
	DeviceBytes memdev.Counters
	// Cost is what the restore cost the host until ready (cost.go).
	Cost Cost
	// Passthrough says the kernel served the guest's memory from the
	// local lower file itself (memdev.Passthrougher): no block was checked
	// against the digest table before the guest saw it, and the device
	// saw none of its faults, so the startup-set accounting knows only
	// what was prefetched and the restore leaves nothing to learn from
	// (Observation is nil).
	Passthrough bool
	Ready       vmm.ReadyInfo
	// Trace holds the first touches until ready when Options.Trace was set.
	Trace []memdev.Touch
	// Generation is the device's number (memdev.ID.Generation): a
	// generation shared by restores, or the number of one VM's own device.
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

	// held is what the instance holds until Stop (stop.go); exit tracks
	// the VM's process exiting on its own after ready (exit.go).
	held *holdings
	exit *exitWatch
	// pause is what a pause of the instance keeps (pause.go).
	pause *pauseState
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
	_, err := inst.held.stopOnce(ctx)
	return err
}

// StopReported is Stop returning the shutdown's timings.
func (inst *Instance) StopReported(ctx context.Context) (StopReport, error) {
	return inst.held.stopOnce(ctx)
}

// State is StateRunning, StateExited or StateStopped.
func (inst *Instance) State() string { return inst.exit.state() }

// Exited is closed when the VM's process exits on its own after ready. It
// never closes for a VM that Stop stopped.
func (inst *Instance) Exited() <-chan struct{} { return inst.exit.exited }

// Exit is how the VM's process ended, with ok true, once it exited on its
// own after ready.
func (inst *Instance) Exit() (exit vmm.ProcessExit, ok bool) { return inst.exit.exit() }

// Share is another reference to the restore's device generation, which
// outlives the restore (the daemon's hold, which reads its counters
// across restores and releases it on its own); memdev.ErrNotShared when
// the device is this VM's alone (memdev.Sharer).
func (inst *Instance) Share() (memdev.Device, error) {
	if s, ok := inst.held.dev.(memdev.Sharer); ok {
		return s.Share()
	}
	return nil, memdev.ErrNotShared
}
