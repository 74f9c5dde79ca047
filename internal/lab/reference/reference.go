// Package reference prepares the reference workload every benchmark and the
// demo run on: the synthetic snapshot of internal/lab/synth, published into a
// repository, with its startup manifest recorded by the same recorder a
// production publish uses.
package reference

import (
	"context"
	"fmt"
	"io"
	"os"

	"warmstart/internal/lab/synth"
	"warmstart/internal/layout"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
)

// Options say what to prepare.
type Options struct {
	// Dir receives the synthesized files.
	Dir         string
	MemoryBytes int64
	Seed        uint64
	Alias       string
	Progress    io.Writer
}

// Snapshot is a published reference snapshot.
type Snapshot struct {
	ID    string
	Paths synth.Paths
}

// Publish synthesizes the reference snapshot into o.Dir and publishes it.
// When rec is non-nil its manifest is recorded in the background, holding
// the capture lease, and the returned job reports the outcome; publish does
// not wait for it.
func Publish(ctx context.Context, repo repository.Repository, rec *recorder.Recorder, o Options) (Snapshot, *recorder.Job, error) {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	paths, err := synth.Generate(ctx, synth.Options{MemoryBytes: o.MemoryBytes, Seed: o.Seed, Dir: o.Dir, Progress: o.Progress})
	if err != nil {
		return Snapshot{}, nil, fmt.Errorf("reference snapshot: %w", err)
	}
	spec, err := os.ReadFile(paths.Layout)
	if err != nil {
		return Snapshot{}, nil, fmt.Errorf("reference snapshot: %w", err)
	}
	l, err := layout.Parse(string(spec), o.MemoryBytes)
	if err != nil {
		return Snapshot{}, nil, fmt.Errorf("reference snapshot layout: %w", err)
	}
	lease, err := repo.BeginCapture(ctx)
	if err != nil {
		return Snapshot{}, nil, fmt.Errorf("reference snapshot: %w", err)
	}
	rec2, err := repo.Publish(ctx, lease, repository.PublishRequest{
		VMStatePath: paths.VMState, MemoryPath: paths.Memory, Layout: l, Alias: o.Alias,
	})
	if err != nil {
		lease.End()
		return Snapshot{}, nil, fmt.Errorf("reference snapshot: %w", err)
	}
	snap := Snapshot{ID: rec2.ID, Paths: paths}
	if rec == nil {
		return snap, nil, lease.End()
	}
	return snap, rec.Start(ctx, lease), nil
}
