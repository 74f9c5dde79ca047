package restore

import (
	"context"
	"errors"
	"fmt"

	"warmstart/internal/integrity"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
	"warmstart/internal/vmm"
)

// waitReady waits for the guest agent, or for the device to stop serving,
// and records the time to ready.
func (s *sequence) waitReady(ctx context.Context) error {
	ready, err := waitReadyOrGone(ctx, s.held.vm, s.held.dev)
	if err != nil {
		return s.explain(err)
	}
	s.inst.Timings.Ready = s.since()
	if !ready.Ready.IsZero() && ready.Ready.After(s.t0) {
		// The driver saw the guest become ready; what it did after that
		// (the replay VMM hashes what it read) is not the guest's time.
		s.inst.Timings.Ready = ready.Ready.Sub(s.t0)
	}
	s.inst.Ready = ready
	return nil
}

// waitReadyOrGone waits for vm's guest to be ready, or stops vm when dev
// stops serving first.
func waitReadyOrGone(ctx context.Context, vm vmm.VM, dev memdev.Device) (vmm.ReadyInfo, error) {
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
func (s *sequence) explain(err error) error {
	snapshot := s.src.SnapshotID
	if c := corruption(s.held.dev); c != nil && !errors.Is(err, integrity.ErrCorrupt) {
		return markIntegrity(fmt.Errorf("snapshot %s: memory %w (%w)", snapshot, c, err))
	}
	if c := s.damage.err(); c != nil && !errors.Is(err, repository.ErrIntegrity) {
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
