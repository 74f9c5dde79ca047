package node

import (
	"context"
	"fmt"
	"log/slog"

	"warmstart/internal/config"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/s3"
)

// RepositoryOptions adjust how OpenRepository opens the configured
// repository.
type RepositoryOptions struct {
	// Store, when set, is a POSIX store directory used instead of the
	// configured repository (the CLI's --store).
	Store string
	// ReadOnly opens a POSIX store without creating, locking or sweeping
	// anything; a store that does not exist is then an error naming it.
	ReadOnly bool
	// Warn is told what a POSIX store's sweep at a writable open could not
	// clean up (posixfs.Options.Warn); nil ignores it.
	Warn func(error)
	// Log receives an S3 repository's node cache warnings
	// (s3.Options.Log); nil discards them.
	Log *slog.Logger
}

// OpenRepository opens the snapshot repository cfg names.
func OpenRepository(ctx context.Context, cfg *config.Config, o RepositoryOptions) (repository.Repository, error) {
	if o.Store != "" {
		return openPosixFS(o.Store, o)
	}
	switch cfg.Snapshot.RepositoryBackend {
	case config.BackendPosixFS:
		return openPosixFS(cfg.Backend.PosixFS.SnapshotStore, o)
	case config.BackendS3:
		so := s3.OptionsFromConfig(cfg.Backend.S3)
		so.ReadOnly, so.Log = o.ReadOnly, o.Log
		repo, err := s3.Open(ctx, so)
		if err != nil {
			return nil, err
		}
		return repo, nil
	default:
		return nil, fmt.Errorf("snapshot.repository_backend %q is not available in this build", cfg.Snapshot.RepositoryBackend)
	}
}

func openPosixFS(store string, o RepositoryOptions) (repository.Repository, error) {
	repo, err := posixfs.Open(store, posixfs.Options{ReadOnly: o.ReadOnly, Warn: o.Warn})
	if err != nil {
		return nil, err
	}
	return repo, nil
}
