// Package capture takes a snapshot of warmstart's real test guest and
// publishes it: it boots a fresh QEMU guest whose /init is the
// warmstart-agent, waits for the agent, captures the guest, publishes the
// device state and memory file into a repository with the driver's memory
// layout and, like a production publish with recording enabled, records the
// startup manifest in the background from the real guest's memory-device
// reads while holding the capture lease.
//
// The guest's memory file is written where Options.StagingDir says. When
// that directory is on the repository's file system the repository
// hard-links the file instead of copying 128 MiB, so callers put it inside
// the store when they can.
//
// Nothing in a repository record says which accelerator captured a guest.
// A QEMU snapshot restores only under the accelerator (and CPU model,
// memory size and vCPU count) it was captured with, so Snapshot.Accel is
// reported for the operator, and restores must run with the same [qemu]
// configuration as the capture.
package capture

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"warmstart/internal/initramfs"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/vmm/qemu"
)

// Options say how to capture.
type Options struct {
	// Driver boots and captures the guest. Required.
	Driver *qemu.Driver
	// Initrd is the agent's initramfs. When empty it is built with
	// Initramfs (whose CacheDir is then required).
	Initrd    string
	Initramfs initramfs.Options
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
	// Token is what the captured agent answers every ping with: drawn at
	// boot and held only in guest memory, so a restore that answers with
	// it resumed this guest's state.
	Token string
	// Accel is the accelerator the guest ran under; restores must use it.
	Accel string
	// Boot is from QEMU's start to the agent's first answer.
	Boot time.Duration
	// Capture is from the capture's start to QEMU's exit after it.
	Capture time.Duration
}

// Publish boots, captures and publishes a guest into repo. When rec is not
// nil its startup manifest is then recorded in the background under the
// capture lease, and the returned job reports the outcome; Publish does not
// wait for it. On error no QEMU process, socket or staging file is left,
// and nothing is published.
func Publish(ctx context.Context, repo repository.Repository, rec *recorder.Recorder, o Options) (Snapshot, *recorder.Job, error) {
	if o.Driver == nil || o.StagingDir == "" || o.RuntimeDir == "" {
		return Snapshot{}, nil, errors.New("capture: driver, staging directory and runtime directory are required")
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	if o.Alias != "" {
		// Publish decides a race for the alias atomically; this only
		// spares a ten-second boot when the alias is already taken.
		holder, err := repo.ResolveAlias(ctx, o.Alias)
		switch {
		case err == nil:
			return Snapshot{}, nil, fmt.Errorf("capture: %w", &repository.AliasConflictError{Alias: o.Alias, HolderID: holder})
		case !errors.Is(err, repository.ErrNotFound):
			return Snapshot{}, nil, fmt.Errorf("capture: alias %s: %w", o.Alias, err)
		}
	}
	initrd := o.Initrd
	if initrd == "" {
		fmt.Fprintln(progress, "building the agent's initramfs")
		var err error
		if initrd, err = initramfs.Build(ctx, o.Initramfs); err != nil {
			return Snapshot{}, nil, fmt.Errorf("capture: %w", err)
		}
	}
	accel, err := o.Driver.Accel(ctx)
	if err != nil {
		return Snapshot{}, nil, fmt.Errorf("capture: %w", err)
	}

	lease, err := repo.BeginCapture(ctx)
	if err != nil {
		return Snapshot{}, nil, fmt.Errorf("capture: %w", err)
	}
	snap, err := captureAndPublish(ctx, repo, lease, initrd, accel, o, progress)
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

func captureAndPublish(ctx context.Context, repo repository.Repository, lease repository.Lease, initrd, accel string, o Options, progress io.Writer) (Snapshot, error) {
	id := lease.SnapshotID()
	snap := Snapshot{Accel: accel}
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
	fmt.Fprintf(progress, "booting a %d MiB guest under %s\n", o.Driver.MemoryBytes()>>20, accel)
	m, err := o.Driver.Boot(ctx, qemu.BootSpec{MemPath: memPath, Initrd: initrd, RuntimeDir: run})
	if err != nil {
		return snap, fmt.Errorf("capture %s: %w", id, err)
	}
	ready := m.Ready()
	snap.Token = ready.Detail["token"]
	snap.Boot = ready.Ready.Sub(ready.Started)
	fmt.Fprintf(progress, "agent answered after %v; capturing\n", snap.Boot.Round(time.Millisecond))
	t := time.Now()
	if err := m.Capture(ctx, statePath); err != nil {
		return snap, fmt.Errorf("capture %s: %w", id, err)
	}
	snap.Capture = time.Since(t)
	// The guest's RAM reached the memory file through a shared mapping, so
	// its pages may still be dirty in the page cache. The repository may
	// hard-link the file; it must be durable before the record says so.
	if err := syncFile(memPath); err != nil {
		return snap, fmt.Errorf("capture %s: %w", id, err)
	}
	fmt.Fprintf(progress, "captured in %v; publishing\n", snap.Capture.Round(time.Millisecond))
	snap.Record, err = repo.Publish(ctx, lease, repository.PublishRequest{
		VMStatePath: statePath,
		MemoryPath:  memPath,
		Layout:      o.Driver.Layout(),
		Alias:       o.Alias,
	})
	if err != nil {
		return snap, fmt.Errorf("capture %s: %w", id, err)
	}
	return snap, nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}
