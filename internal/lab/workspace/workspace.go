// Package workspace lays a throwaway node out under one directory, for the
// lab: the benchmark, the S3 benchmark, the demo and tests. It is apart
// from package reference, which the repository's own tests use to publish
// the reference snapshot and so must not reach the node.
package workspace

import (
	"context"
	"path/filepath"

	"warmstart/internal/config"
	"warmstart/internal/lab/synth"
	"warmstart/internal/node"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/replay"
)

// Workspace lays a throwaway node out under one directory: a POSIX
// repository at store/, the file device at mnt/, the recorder's tracing
// mount at trace-mnt/ and the restores' directories under run/. The
// benchmark, the S3 benchmark, the demo and the tests use it: the one
// throwaway-node helper of the lab.
type Workspace struct {
	Dir string
	// Device is the memory device recordings run on.
	Device string
	// Repository keeps the snapshots; a POSIX store under store/ when nil.
	Repository repository.Repository
	// Remote says Repository is an S3 repository: the settings that
	// follow from the backend (the readaround window) follow it.
	Remote bool
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
func (w Workspace) Open(ctx context.Context) (*node.Node, error) {
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
	if w.Remote {
		// The device settings that follow from the backend (the
		// readaround window) follow the repository given.
		cfg.Snapshot.RepositoryBackend = config.BackendS3
	}
	vm := w.VMM
	if vm == nil {
		vm = &replay.VMM{TracePath: synth.PathsIn(w.ReferenceDir()).Trace}
	}
	return node.Open(ctx, node.Options{
		Config:     cfg,
		Repository: repo,
		VMM:        vm,
		RuntimeDir: filepath.Join(w.Dir, "run"),
		FUSEMount:  filepath.Join(w.Dir, "mnt"),
		TraceMount: filepath.Join(w.Dir, "trace-mnt"),
	})
}
