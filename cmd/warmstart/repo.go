package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/config"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/s3"
)

// storeFlag names the flag that overrides [backend.posix_fs] snapshot_store
// for the verbs that define it.
const storeFlag = "store"

// openRepository opens the snapshot repository the configuration (--config)
// names. A verb that defines --store may point it at another POSIX store
// directory without a configuration file.
func openRepository(cmd *cobra.Command) (repository.Repository, error) {
	return openRepositoryAs(cmd, false)
}

// openReadOnlyRepository is openRepository for verbs that only read: a
// POSIX store is opened without creating, locking or sweeping anything,
// and a store that does not exist is an error naming it; an S3 repository
// is opened without writing to the bucket or creating anything at open.
func openReadOnlyRepository(cmd *cobra.Command) (repository.Repository, error) {
	return openRepositoryAs(cmd, true)
}

func openRepositoryAs(cmd *cobra.Command, readOnly bool) (repository.Repository, error) {
	cfg, err := config.Load(configPath)
	if err != nil {
		return nil, err
	}
	store := cfg.Backend.PosixFS.SnapshotStore
	if f := cmd.Flags().Lookup(storeFlag); f != nil && f.Changed {
		return openPosixFS(f.Value.String(), readOnly)
	}
	switch cfg.Snapshot.RepositoryBackend {
	case config.BackendPosixFS:
		return openPosixFS(store, readOnly)
	case config.BackendS3:
		o := s3.OptionsFromConfig(cfg.Backend.S3)
		o.ReadOnly = readOnly
		repo, err := s3.Open(cmd.Context(), o)
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
