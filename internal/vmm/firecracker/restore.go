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
func (d *Driver) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	m, err := d.RestoreMachine(ctx, spec, RestoreOptions{HandlerDone: spec.HandlerDone})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// RestoreMachine spawns Firecracker in spec.RuntimeDir, waits for its API
// socket, asks its release and sends PUT /snapshot/load with the body that
// release accepts, with resume_vm unless spec.Paused (then Resume lets the
// guest run). With the Uffd backend Firecracker connects to the handler's
// socket at spec.MemPath during the load and faults guest memory through
// it before it answers, so the handler must already be serving. On any
// failure the process is killed and gone before RestoreMachine returns;
// its logs stay in the runtime directory.
func (d *Driver) RestoreMachine(ctx context.Context, spec vmm.RestoreSpec, opts RestoreOptions) (*Machine, error) {
	if err := checkRestoreSpec(spec); err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	if err := d.CheckState(spec.VMStatePath); err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	var sockets []string
	if d.opts.Vsock {
		sockets = append(sockets, filepath.Join(spec.RuntimeDir, VsockSocketName))
	}
	m, err := d.launch(ctx, spec.RuntimeDir, sockets)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	load, err := d.snapshotLoad(m.version, spec)
	if err != nil {
		m.abort(KillStartFailed)
		return nil, fmt.Errorf("restore %s: %w", spec.SnapshotID, err)
	}
	m.tracking = load.TrackDirtyPages || load.EnableDiffSnapshots
	m.memBytes = spec.Layout.FileSize
	if opts.HandlerDone != nil {
		// Watch from before the load: Firecracker faults through the
		// handler inside it.
		go m.watchHandler(opts.HandlerDone)
	}
	m.started = time.Now()
	if err := m.load(ctx, load); err != nil {
		return nil, m.failed(ctx, fmt.Sprintf("restore %s: load snapshot", spec.SnapshotID), err)
	}
	return m, nil
}

// snapshotLoad is the load body for spec that release v accepts: an
// optional field goes in only when it is wanted and v knows it. A
// pausable restore tracks dirty pages whatever the options say: its
// SaveDiff needs them (pause.go).
func (d *Driver) snapshotLoad(v Version, spec vmm.RestoreSpec) (SnapshotLoad, error) {
	load := SnapshotLoad{
		SnapshotPath: spec.VMStatePath,
		MemBackend:   MemoryBackend{BackendType: spec.Backend, BackendPath: spec.MemPath},
		ResumeVM:     !spec.Paused,
	}
	if d.opts.TrackDirtyPages || spec.Pausable {
		if v.AtLeast(trackDirtyPagesSince) {
			load.TrackDirtyPages = true
		} else {
			load.EnableDiffSnapshots = true
		}
	}
	if d.opts.Vsock {
		if !v.AtLeast(vsockOverrideSince) {
			return SnapshotLoad{}, fmt.Errorf("%w: firecracker %s cannot rebind a restored vsock device to this restore's socket (vsock_override needs %s or later), which the vsock agent address needs",
				ErrUnsupportedVersion, v, vsockOverrideSince)
		}
		load.VsockOverride = &VsockOverride{UDSPath: filepath.Join(spec.RuntimeDir, VsockSocketName)}
	}
	return load, nil
}

// load sends the snapshot load under its own bound, Options.LoadTimeout
// (DefaultLoadTimeout says why): Firecracker answers only once it has
// faulted guest memory through the memory device, and nothing else ends a
// load whose fault is never served.
func (m *Machine) load(ctx context.Context, body SnapshotLoad) error {
	lctx, cancel := context.WithTimeoutCause(ctx, m.opts.LoadTimeout,
		fmt.Errorf("%w: no answer within %v (load timeout)", ErrLoadTimeout, m.opts.LoadTimeout))
	defer cancel()
	err := m.client.LoadSnapshot(lctx, body)
	if err != nil && ctx.Err() == nil && lctx.Err() != nil && !errors.Is(err, ErrLoadTimeout) {
		return fmt.Errorf("%w: %v", context.Cause(lctx), err)
	}
	return err
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
