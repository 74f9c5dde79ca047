package firecracker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"warmstart/internal/vmm"
)

var _ vmm.VMM = (*Driver)(nil)

// RestoreOptions are per-restore settings vmm.RestoreSpec does not carry.
type RestoreOptions struct {
	// HandlerDone is closed when the page-fault handler serving a Uffd
	// restore stops. If that happens before the VM is stopped, the driver
	// kills the VM, and WaitReady and Wait report ErrHandlerDied. Without
	// it a dead handler leaves the VM hung until RequestStop's timeout.
	HandlerDone <-chan struct{}
}

// Restore spawns Firecracker and loads the snapshot. It implements
// vmm.VMM; RestoreMachine takes the page-fault handler's done channel as
// well.
func (d *Driver) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.Instance, error) {
	m, err := d.RestoreMachine(ctx, spec, RestoreOptions{HandlerDone: spec.HandlerDone})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// RestoreMachine spawns Firecracker in spec.RuntimeDir, waits for its API
// socket and sends PUT /snapshot/load, with resume_vm unless spec.Paused
// (then Resume lets the guest run). With the Uffd backend Firecracker
// connects to the handler's socket at spec.MemPath during the load. On any
// failure the process is killed and gone before RestoreMachine returns;
// its logs stay in the runtime directory.
func (d *Driver) RestoreMachine(ctx context.Context, spec vmm.RestoreSpec, opts RestoreOptions) (*Machine, error) {
	if err := checkRestoreSpec(spec); err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	load := SnapshotLoad{
		SnapshotPath:    spec.VMStatePath,
		MemBackend:      MemoryBackend{BackendType: spec.Backend, BackendPath: spec.MemPath},
		TrackDirtyPages: d.opts.TrackDirtyPages,
		ResumeVM:        !spec.Paused,
	}
	var sockets []string
	if d.opts.Vsock {
		load.VsockOverride = &VsockOverride{UDSPath: filepath.Join(spec.RuntimeDir, VsockSocketName)}
		sockets = append(sockets, load.VsockOverride.UDSPath)
	}
	m, err := d.launch(ctx, spec.RuntimeDir, sockets)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	if opts.HandlerDone != nil {
		// Watch from before the load: Firecracker blocks in it until the
		// handler takes the userfaultfd.
		go m.watchHandler(opts.HandlerDone)
	}
	m.started = time.Now()
	if err := m.client.LoadSnapshot(ctx, load); err != nil {
		return nil, m.failed(ctx, fmt.Sprintf("restore %s: load snapshot", spec.SnapshotID), err)
	}
	return m, nil
}

func checkRestoreSpec(spec vmm.RestoreSpec) error {
	switch {
	case spec.RuntimeDir == "":
		return errors.New("runtime directory is empty")
	case spec.VMStatePath == "":
		return errors.New("vm state path is empty")
	case spec.MemPath == "":
		return errors.New("memory path is empty")
	case spec.Backend != vmm.BackendFile && spec.Backend != vmm.BackendUffd:
		return fmt.Errorf("memory backend %q is neither %s nor %s", spec.Backend, vmm.BackendFile, vmm.BackendUffd)
	}
	return nil
}
