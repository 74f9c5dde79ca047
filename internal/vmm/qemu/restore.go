package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"warmstart/internal/vmm"
)

// Restore starts QEMU on a captured guest; see RestoreMachine.
func (d *Driver) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	m, err := d.RestoreMachine(ctx, spec)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// CheckBackend refuses every memory backend but File (ErrUnsupportedBackend),
// whatever the driver's options: QEMU maps guest memory from a file.
func CheckBackend(b vmm.Backend) error {
	if b != vmm.BackendFile {
		return fmt.Errorf("%w: %q (only %q)", ErrUnsupportedBackend, b, vmm.BackendFile)
	}
	return nil
}

// CheckBackend is the package's CheckBackend (vmm.BackendChecker).
func (d *Driver) CheckBackend(b vmm.Backend) error { return CheckBackend(b) }

// RestoreMachine restores the guest captured in spec.VMStatePath with its
// memory mapped MAP_PRIVATE from spec.MemPath (the memory device's file),
// and continues it. It returns once the guest runs; WaitReady then waits
// for the agent. ReadyInfo.Started is taken just before QEMU starts. On
// error no QEMU process is left.
func (d *Driver) RestoreMachine(ctx context.Context, spec vmm.RestoreSpec) (m *Machine, err error) {
	if err := CheckBackend(spec.Backend); err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	if err := d.checkLayout(spec); err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	if fi, err := os.Stat(spec.MemPath); err != nil {
		return nil, fmt.Errorf("restore %s: memory file: %w", spec.SnapshotID, err)
	} else if fi.Size() < d.MemoryBytes() {
		return nil, fmt.Errorf("restore %s: memory file %s holds %d bytes, the guest has %d", spec.SnapshotID, spec.MemPath, fi.Size(), d.MemoryBytes())
	}
	statePath, err := filepath.Abs(spec.VMStatePath)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	if err := d.CheckState(statePath); err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	memPath, err := filepath.Abs(spec.MemPath)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	accel, err := d.Accel(ctx)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}

	// -S keeps the guest paused after the incoming migration, so that cont
	// is the moment it resumes; -incoming defer waits for the QMP
	// migrate-incoming, after x-ignore-shared is set on this side too.
	args := machineArgs(accel, d.opts.Machine, d.opts.MemoryMiB, d.opts.VCPUs)
	args = append(args, memoryArgs(d.opts.MemoryMiB, memPath, spec.Pausable)...)
	args = append(args, "-S", "-incoming", "defer")
	m, err = d.start(ctx, spec.RuntimeDir, args)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	defer func() {
		if err != nil {
			m.kill()
			err = m.withLog(fmt.Errorf("restore %s: %w", spec.SnapshotID, err))
			m = nil
		}
	}()
	if err := m.mon.ignoreShared(ctx); err != nil {
		return m, err
	}
	uri := "exec:cat " + shellQuote(statePath)
	if err := m.mon.execute(ctx, "migrate-incoming", map[string]string{"uri": uri}, nil); err != nil {
		return m, err
	}
	if err := m.waitIncoming(ctx); err != nil {
		return m, err
	}
	if err := m.mon.execute(ctx, "cont", nil, nil); err != nil {
		return m, err
	}
	m.resumed = time.Now()
	m.pausable = spec.Pausable
	return m, nil
}

// checkLayout accepts an empty layout (the caller has none) or exactly the
// driver's one region.
func (d *Driver) checkLayout(spec vmm.RestoreSpec) error {
	if len(spec.Layout.Regions) == 0 && spec.Layout.FileSize == 0 {
		return nil
	}
	if want := d.Layout(); !spec.Layout.Equal(want) {
		return fmt.Errorf("memory layout %s (file %d bytes) is not this driver's %s (file %d bytes)",
			spec.Layout, spec.Layout.FileSize, want, want.FileSize)
	}
	return nil
}

// waitIncoming polls query-status until the incoming migration has loaded
// the device state and the guest sits paused.
func (m *Machine) waitIncoming(ctx context.Context) error {
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		var st runStatus
		if err := m.mon.execute(ctx, "query-status", nil, &st); err != nil {
			// QEMU exits when an incoming migration fails; the error
			// then carries its exit status and log.
			return err
		}
		switch st.Status {
		case "inmigrate":
		case "paused":
			return nil
		default:
			var mig migrationStatus
			if err := m.mon.execute(ctx, "query-migrate", nil, &mig); err == nil && mig.ErrorDesc != "" {
				return fmt.Errorf("incoming migration ended in state %q: %s", st.Status, mig.ErrorDesc)
			}
			return fmt.Errorf("incoming migration ended in state %q, want paused", st.Status)
		}
		select {
		case <-ticker.C:
		case <-m.exited:
			return fmt.Errorf("incoming migration: %w", m.exitError())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
