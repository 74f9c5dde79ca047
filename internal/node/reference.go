package node

import (
	"context"
	"path/filepath"

	"warmstart/internal/config"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/s3"
	"warmstart/internal/synth"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/replay"
)

// Workspace lays a throwaway node out under one directory: a POSIX
// repository at store/, the file device at mnt/, the recorder's tracing
// mount at trace-mnt/ and the restores' directories under run/. The
// benchmark, the demo and the tests use it.
type Workspace struct {
	Dir string
	// Device is the memory device recordings run on.
	Device string
	// Repository keeps the snapshots; a POSIX store under store/ when nil.
	Repository repository.Repository
	// VMM restores; the replay VMM playing the reference trace under
	// ReferenceDir when nil.
	VMM vmm.VMM
	// ReadaroundKiB and PrefetchReadaroundKiB are the operator's [memory]
	// readaround windows, so that a benchmark run with --config measures
	// that configuration; 0 keeps the built-in ones.
	ReadaroundKiB, PrefetchReadaroundKiB int64
}

// ReferenceDir is where reference.Publish writes the reference snapshot's
// files in a workspace.
func (w Workspace) ReferenceDir() string { return filepath.Join(w.Dir, "reference") }

// Open assembles the workspace's node with the built-in configuration.
func (w Workspace) Open(ctx context.Context) (*Node, error) {
	repo := w.Repository
	if repo == nil {
		store, err := posixfs.Open(filepath.Join(w.Dir, "store"), posixfs.Options{})
		if err != nil {
			return nil, err
		}
		repo = store
	}
	cfg := config.Default()
	cfg.Memory.Device = w.Device
	cfg.Memory.ReadaroundKiB = w.ReadaroundKiB
	if w.PrefetchReadaroundKiB != 0 {
		cfg.Memory.PrefetchReadaroundKiB = w.PrefetchReadaroundKiB
	}
	if _, remote := repo.(*s3.Repo); remote {
		// The device settings that follow from the backend (the
		// readaround window) follow the repository given.
		cfg.Snapshot.RepositoryBackend = config.BackendS3
	}
	vm := w.VMM
	if vm == nil {
		vm = &replay.VMM{TracePath: synth.PathsIn(w.ReferenceDir()).Trace}
	}
	return Open(ctx, Options{
		Config:     cfg,
		Repository: repo,
		VMM:        vm,
		RuntimeDir: filepath.Join(w.Dir, "run"),
		FUSEMount:  filepath.Join(w.Dir, "mnt"),
		TraceMount: filepath.Join(w.Dir, "trace-mnt"),
	})
}
