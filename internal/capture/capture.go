// Package capture takes a snapshot of a freshly booted guest and publishes
// it: it boots the guest through a Booter, waits for its agent, captures it,
// publishes the device state and memory file into a repository with the
// memory layout the VMM reports and, like a production publish with
// recording enabled, records the startup manifest in the background from
// the guest's memory-device reads while holding the capture lease.
//
// Booting and capturing are the only VMM-specific steps; QEMU (the real
// guest on this kind of host) and Firecracker (production) adapt the two
// drivers that can boot a guest, and everything else is one path.
//
// The guest's memory file is written where Options.StagingDir says. When
// that directory is on the repository's file system the repository
// hard-links the file instead of copying it, so callers put it inside the
// store when they can.
//
// Nothing in a repository record says which accelerator, memory size or
// vCPU count captured a guest, and a snapshot restores only under the ones
// it was captured with, so Snapshot.Accel is reported for the operator and
// restores must run with the VMM configuration of the capture.
package capture

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"warmstart/internal/durable"
	"warmstart/internal/layout"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/vmm"
)

// Booter boots the fresh guests a capture snapshots.
type Booter interface {
	// Prepare does what is slow and needs no snapshot yet: building or
	// checking what the guest boots from, probing the host. It runs before
	// the capture lease is taken, so a capture that cannot boot fails
	// without ever holding one.
	Prepare(ctx context.Context, progress io.Writer) (GuestInfo, error)
	// Boot starts a fresh guest whose sockets and logs go in
	// spec.RuntimeDir and returns once its agent has answered. On error
	// no VMM process is left.
	Boot(ctx context.Context, spec BootSpec) (Guest, vmm.ReadyInfo, error)
}

// GuestInfo describes the guests a Booter boots.
type GuestInfo struct {
	// Accel is the accelerator the guest runs under: "kvm" or "tcg".
	Accel string
	// MemoryBytes is the guest's RAM, and the size of its memory file.
	MemoryBytes int64
}

// BootSpec holds one boot's private paths.
type BootSpec struct {
	// RuntimeDir exists and is removed after the capture. Unix socket
	// paths are limited to 107 bytes, so it is short.
	RuntimeDir string
	// MemPath is where the memory file must be once the guest is
	// captured. A VMM whose guest RAM is a shared mapping of a file from
	// boot (QEMU here) maps this file; one that writes the memory out at
	// capture (Firecracker) is handed the path again by Guest.Capture.
	MemPath string
}

// Guest is a booted guest whose agent has answered.
type Guest interface {
	// Capture snapshots the guest: its device state to vmStatePath, its
	// memory to memPath (the BootSpec's). It returns the memory file's
	// layout as the VMM lays guest RAM out in it. The VM is gone when
	// Capture returns, whatever the outcome: the snapshot holds its state,
	// and a guest whose capture failed must not outlive it.
	Capture(ctx context.Context, vmStatePath, memPath string) (layout.Layout, error)
}

// Options say how to capture.
type Options struct {
	// Booter boots and captures the guest. Required.
	Booter Booter
	// StagingDir receives a private directory holding the guest's memory
	// file and device state until they are published; removed afterwards.
	// Required.
	StagingDir string
	// RuntimeDir receives a private directory for the guest's sockets and
	// log; removed afterwards. Keep it short: Unix socket paths are limited
	// to 107 bytes. Required.
	RuntimeDir string
	// Alias is bound to the snapshot when not empty.
	Alias string
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
}

// Snapshot is a published guest snapshot.
type Snapshot struct {
	Record repository.Record
	// Token is what the captured agent answers every ping with, when it
	// reports one (warmstart-agent does): drawn at boot and held only in
	// guest memory, so a restore that answers with it resumed this
	// guest's state.
	Token string
	// Accel is the accelerator the guest ran under; restores must use it.
	Accel string
	// Ready is what the driver learned when the booted guest's agent
	// first answered.
	Ready vmm.ReadyInfo
	// Boot is from the VMM's start to the agent's first answer.
	Boot time.Duration
	// Capture is from the capture's start to the VM being gone after it.
	Capture time.Duration
}

// Publish boots, captures and publishes a guest into repo. When rec is not
// nil its startup manifest is then recorded in the background under the
// capture lease, and the returned job reports the outcome; Publish does not
// wait for it. On error no VMM process, socket or staging file is left,
// and nothing is published.
func Publish(ctx context.Context, repo repository.Repository, rec *recorder.Recorder, o Options) (Snapshot, *recorder.Job, error) {
	if o.Booter == nil || o.StagingDir == "" || o.RuntimeDir == "" {
		return Snapshot{}, nil, errors.New("capture: booter, staging directory and runtime directory are required")
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	if o.Alias != "" {
		// Publish decides a race for the alias atomically; this only
		// spares a boot when the alias is already taken.
		holder, err := repo.ResolveAlias(ctx, o.Alias)
		switch {
		case err == nil:
			return Snapshot{}, nil, fmt.Errorf("capture: %w", &repository.AliasConflictError{Alias: o.Alias, HolderID: holder})
		case !errors.Is(err, repository.ErrNotFound):
			return Snapshot{}, nil, fmt.Errorf("capture: alias %s: %w", o.Alias, err)
		}
	}
	info, err := o.Booter.Prepare(ctx, progress)
	if err != nil {
		return Snapshot{}, nil, fmt.Errorf("capture: %w", err)
	}

	lease, err := repo.BeginCapture(ctx)
	if err != nil {
		return Snapshot{}, nil, fmt.Errorf("capture: %w", err)
	}
	snap, err := captureAndPublish(ctx, repo, lease, info, o, progress, rec != nil)
	if err != nil {
		lease.End()
		return Snapshot{}, nil, err
	}
	if rec == nil {
		if err := lease.End(); err != nil {
			return snap, nil, fmt.Errorf("capture %s: end lease: %w", snap.Record.ID, err)
		}
		return snap, nil, nil
	}
	return snap, rec.Start(ctx, lease), nil
}

func captureAndPublish(ctx context.Context, repo repository.Repository, lease repository.Lease, info GuestInfo, o Options, progress io.Writer, recordManifest bool) (Snapshot, error) {
	id := lease.SnapshotID()
	snap := Snapshot{Accel: info.Accel}
	staging, err := os.MkdirTemp(o.StagingDir, ".capture-")
	if err != nil {
		return snap, fmt.Errorf("capture %s: staging directory: %w", id, err)
	}
	defer os.RemoveAll(staging)
	run, err := os.MkdirTemp(o.RuntimeDir, "capture-")
	if err != nil {
		return snap, fmt.Errorf("capture %s: runtime directory: %w", id, err)
	}
	defer os.RemoveAll(run)

	memPath := filepath.Join(staging, repository.MemoryFileName)
	statePath := filepath.Join(staging, repository.VMStateFileName)
	fmt.Fprintf(progress, "booting a %d MiB guest under %s\n", info.MemoryBytes>>20, info.Accel)
	guest, ready, err := o.Booter.Boot(ctx, BootSpec{RuntimeDir: run, MemPath: memPath})
	if err != nil {
		return snap, fmt.Errorf("capture %s: %w", id, err)
	}
	snap.Ready = ready
	snap.Token = ready.Detail.Token
	snap.Boot = ready.Ready.Sub(ready.Started)
	fmt.Fprintf(progress, "agent answered after %v; capturing\n", snap.Boot.Round(time.Millisecond))
	t := time.Now()
	l, err := guest.Capture(ctx, statePath, memPath)
	if err != nil {
		return snap, fmt.Errorf("capture %s: %w", id, err)
	}
	snap.Capture = time.Since(t)
	// The memory file's pages may still be dirty in the page cache (QEMU
	// wrote them through a shared mapping, Firecracker with write(2)). The
	// repository may hard-link the file; it must be durable before the
	// record says so.
	for _, p := range []string{memPath, statePath} {
		if err := durable.Sync(p); err != nil {
			return snap, fmt.Errorf("capture %s: %w", id, err)
		}
	}
	fmt.Fprintf(progress, "captured in %v; publishing\n", snap.Capture.Round(time.Millisecond))
	snap.Record, err = repo.Publish(ctx, lease, repository.PublishRequest{
		VMStatePath:    statePath,
		MemoryPath:     memPath,
		Layout:         l,
		Alias:          o.Alias,
		RecordManifest: recordManifest,
	})
	if err != nil {
		return snap, fmt.Errorf("capture %s: %w", id, err)
	}
	return snap, nil
}
