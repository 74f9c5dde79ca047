package node

import (
	"context"
	"fmt"

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
}

// OpenRepository opens the snapshot repository cfg names.
func OpenRepository(ctx context.Context, cfg *config.Config, o RepositoryOptions) (repository.Repository, error) {
	if o.Store != "" {
		return openPosixFS(o.Store, o.ReadOnly)
	}
	switch cfg.Snapshot.RepositoryBackend {
	case config.BackendPosixFS:
		return openPosixFS(cfg.Backend.PosixFS.SnapshotStore, o.ReadOnly)
	case config.BackendS3:
		so := s3.OptionsFromConfig(cfg.Backend.S3)
		so.ReadOnly = o.ReadOnly
		repo, err := s3.Open(ctx, so)
		if err != nil {
			return nil, err
		}
		return repo, nil
	default:
		return nil, fmt.Errorf("snapshot.repository_backend %q is not available in this build", cfg.Snapshot.RepositoryBackend)
	}
}

func openPosixFS(store string, readOnly bool) (repository.Repository, error) {
	repo, err := posixfs.Open(store, posixfs.Options{ReadOnly: readOnly})
	if err != nil {
		return nil, err
	}
	return repo, nil
}
