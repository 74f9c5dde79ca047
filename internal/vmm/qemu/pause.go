package qemu

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"warmstart/internal/vmm"
)

// A pausable restore (vmm.RestoreSpec.Pausable) maps guest memory shared
// over the memory device's writable view: QEMU 7.2's migration skips a RAM
// block only when it is shared (x-ignore-shared), so with private RAM a
// pause would send every page of guest memory through the device state.
// Shared, the guest's writes reach the device by the kernel's write-back,
// and the device (memdev.WriteTracker) knows the changed pages.

var (
	_ vmm.Pauser         = (*Machine)(nil)
	_ vmm.WritableMemory = (*Driver)(nil)
)

// errNotPausable is a Pause of a machine not restored pausable.
var errNotPausable = errors.New("qemu: machine was not restored pausable")

// WritableMemory implements vmm.WritableMemory: a pausable restore writes
// guest memory back to its file.
func (d *Driver) WritableMemory() bool { return true }

// Pause quiesces the agent and stops the guest's vCPUs.
func (m *Machine) Pause(ctx context.Context) error {
	if !m.pausable {
		return errNotPausable
	}
	if _, err := m.agent.ping(ctx, m.exited); err != nil {
		return fmt.Errorf("pause: quiesce agent: %w", err)
	}
	if err := m.mon.execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	return nil
}

// SaveDiff saves the device state (RAM is ignored: it is shared) to
// spec.Dir; the changed pages are the device's (Diff.DeviceTracked).
func (m *Machine) SaveDiff(ctx context.Context, spec vmm.DiffSpec) (vmm.Diff, error) {
	if !m.pausable {
		return vmm.Diff{}, errNotPausable
	}
	path := filepath.Join(spec.Dir, vmm.DiffVMStateFile)
	if err := m.saveState(ctx, path); err != nil {
		return vmm.Diff{}, fmt.Errorf("save diff: %w", err)
	}
	return vmm.Diff{VMStatePath: path, DeviceTracked: true}, nil
}

// Resume continues a paused guest (also from postmigrate, where a saved
// state leaves it).
func (m *Machine) Resume() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.mon.execute(ctx, "cont", nil, nil); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	m.resumed = time.Now()
	return nil
}
