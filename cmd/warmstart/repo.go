package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/logging"
	"warmstart/internal/node"
	"warmstart/internal/repository"
)

// storeFlag names the flag that overrides [backend.posix_fs] snapshot_store
// for the verbs that define it.
const storeFlag = "store"

// snapshotArg accepts one argument naming a snapshot by id or alias
// (repository.ValidateRef): a name no snapshot can have is refused before
// a store, a daemon or a device is touched, as the verb's usage error, and
// never reported as a snapshot that was not found.
func snapshotArg(cmd *cobra.Command, args []string) error {
	if err := cobra.ExactArgs(1)(cmd, args); err != nil {
		return err
	}
	return checkSnapshotRef(args[0])
}

// optionalSnapshotArg is snapshotArg for a verb whose snapshot may be left
// out.
func optionalSnapshotArg(cmd *cobra.Command, args []string) error {
	if err := cobra.MaximumNArgs(1)(cmd, args); err != nil || len(args) == 0 {
		return err
	}
	return checkSnapshotRef(args[0])
}

func checkSnapshotRef(ref string) error {
	if ref == "" {
		return errors.New("the snapshot argument is empty: give an ID or ALIAS")
	}
	return repository.ValidateRef(ref)
}

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
	cfg, err := loadConfig()
	if err != nil {
		return nil, err
	}
	o := node.RepositoryOptions{ReadOnly: readOnly, Warn: func(err error) {
		fmt.Fprintf(cmd.ErrOrStderr(), "warmstart: warning: %v (the store is usable; the next writable open tries again)\n", err)
	}}
	if f := cmd.Flags().Lookup(storeFlag); f != nil && f.Changed {
		o.Store = f.Value.String()
	}
	if o.Log, err = logging.New(cmd.ErrOrStderr(), cfg.Log); err != nil {
		return nil, err
	}
	return node.OpenRepository(cmd.Context(), cfg, o)
}
