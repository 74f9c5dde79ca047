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
	"warmstart/internal/repository"
	"warmstart/internal/vmm"
)

// Checkpointer is a Guest that can also be captured while it keeps
// running: a sandbox a fleet snapshots, serves from, and snapshots again.
type Checkpointer interface {
	Guest
	// Checkpoint is Capture, except that memPath receives a copy of the
	// guest's memory (any path, not the BootSpec's) and the guest runs
	// on afterwards.
	Checkpoint(ctx context.Context, vmStatePath, memPath string) (layout.Layout, error)
	// Ping has the guest's agent answer one more request.
	Ping(ctx context.Context) (vmm.ReadyInfo, error)
	// Stop stops a guest that is still running, and waits for it.
	Stop(ctx context.Context) error
}

// PublishTwice boots one guest and publishes two snapshots of it: the
// first taken while it keeps running (Checkpoint), the second after its
// agent answered one more ping (Capture). The second differs from the
// first only in what that guest did in between, which is what a
// repository that shares content between snapshots stores once. Neither
// gets an alias (Options.Alias must be empty) or a manifest. On error no
// VMM process or staging file is left; a snapshot already published
// stays, and is returned.
func PublishTwice(ctx context.Context, repo repository.Repository, o Options) ([]Snapshot, error) {
	if o.Booter == nil || o.StagingDir == "" || o.RuntimeDir == "" || o.Alias != "" {
		return nil, errors.New("capture twice: booter, staging directory and runtime directory are required, and an alias cannot name two snapshots")
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	info, err := o.Booter.Prepare(ctx, progress)
	if err != nil {
		return nil, fmt.Errorf("capture twice: %w", err)
	}
	staging, err := os.MkdirTemp(o.StagingDir, ".capture-")
	if err != nil {
		return nil, fmt.Errorf("capture twice: staging directory: %w", err)
	}
	defer os.RemoveAll(staging)
	run, err := os.MkdirTemp(o.RuntimeDir, "capture-")
	if err != nil {
		return nil, fmt.Errorf("capture twice: runtime directory: %w", err)
	}
	defer os.RemoveAll(run)

	memPath := filepath.Join(staging, repository.MemoryFileName)
	fmt.Fprintf(progress, "booting a %d MiB guest under %s\n", info.MemoryBytes>>20, info.Accel)
	guest, ready, err := o.Booter.Boot(ctx, BootSpec{RuntimeDir: run, MemPath: memPath})
	if err != nil {
		return nil, fmt.Errorf("capture twice: %w", err)
	}
	cp, ok := guest.(Checkpointer)
	if !ok {
		_, err := guest.Capture(ctx, filepath.Join(staging, repository.VMStateFileName), memPath)
		return nil, errors.Join(fmt.Errorf("capture twice: a %T guest cannot be captured while it runs", guest), err)
	}
	return captureTwice(ctx, repo, cp, staging, memPath, Snapshot{Accel: info.Accel, Ready: ready,
		Token: ready.Detail.Token, Boot: ready.Ready.Sub(ready.Started)}, progress)
}

// captureTwice checkpoints and publishes the running guest, has it answer
// a ping, then captures and publishes it again.
func captureTwice(ctx context.Context, repo repository.Repository, g Checkpointer, staging, memPath string, base Snapshot, progress io.Writer) ([]Snapshot, error) {
	firstDir := filepath.Join(staging, "first")
	if err := os.Mkdir(firstDir, 0o700); err != nil {
		return nil, errors.Join(fmt.Errorf("capture twice: %w", err), g.Stop(context.WithoutCancel(ctx)))
	}
	first, err := publishOne(ctx, repo, base, progress, func(state string) (string, layout.Layout, error) {
		mem := filepath.Join(firstDir, repository.MemoryFileName)
		l, err := g.Checkpoint(ctx, state, mem)
		return mem, l, err
	}, firstDir)
	if err != nil {
		return nil, errors.Join(err, g.Stop(context.WithoutCancel(ctx)))
	}
	out := []Snapshot{first}
	ready, err := g.Ping(ctx)
	if err == nil && ready.Detail.Token != base.Token {
		// The token lives only in the guest's memory: another token is
		// another guest, and the second snapshot would not be of it.
		err = fmt.Errorf("the agent answers with token %q, not the booted guest's %q", ready.Detail.Token, base.Token)
	}
	if err != nil {
		return out, errors.Join(fmt.Errorf("capture twice: ping after the first capture: %w", err), g.Stop(context.WithoutCancel(ctx)))
	}
	fmt.Fprintf(progress, "agent answered again (uptime %v)\n", ready.Detail.Uptime)
	second, err := publishOne(ctx, repo, base, progress, func(state string) (string, layout.Layout, error) {
		l, err := g.Capture(ctx, state, memPath)
		return memPath, l, err
	}, staging)
	if err != nil {
		// Capture stops the guest whatever the outcome; a lease that
		// could not be taken left it running.
		return out, errors.Join(err, g.Stop(context.WithoutCancel(ctx)))
	}
	return append(out, second), nil
}

// publishOne captures with take (which writes the device state to the
// path it is given and returns where the memory is) under a lease of its
// own and publishes the snapshot.
func publishOne(ctx context.Context, repo repository.Repository, snap Snapshot, progress io.Writer,
	take func(statePath string) (memPath string, l layout.Layout, err error), dir string) (Snapshot, error) {
	lease, err := repo.BeginCapture(ctx)
	if err != nil {
		return snap, fmt.Errorf("capture twice: %w", err)
	}
	defer lease.End()
	id := lease.SnapshotID()
	statePath := filepath.Join(dir, repository.VMStateFileName)
	t := time.Now()
	memPath, l, err := take(statePath)
	if err != nil {
		return snap, fmt.Errorf("capture %s: %w", id, err)
	}
	snap.Capture = time.Since(t)
	for _, p := range []string{memPath, statePath} {
		if err := durable.Sync(p); err != nil {
			return snap, fmt.Errorf("capture %s: %w", id, err)
		}
	}
	fmt.Fprintf(progress, "captured %s in %v; publishing\n", id, snap.Capture.Round(time.Millisecond))
	snap.Record, err = repo.Publish(ctx, lease, repository.PublishRequest{VMStatePath: statePath, MemoryPath: memPath, Layout: l})
	if err != nil {
		return snap, fmt.Errorf("capture %s: %w", id, err)
	}
	return snap, nil
}
