package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/node"
)

var storeCmd = &cobra.Command{
	Use:   "store",
	Short: "Set up the snapshot repository the configuration names",
}

// store init is a verb, not a key that creates the bucket on open:
// creating a bucket is an administrator's act, with a permission
// (s3:CreateBucket) the nodes that publish and restore need not hold, and
// a bucket created on open would turn a mistyped bucket name into a new,
// empty repository instead of an error.
var storeInitCmd = &cobra.Command{
	Use:   "init",
	Short: "Create the repository: the S3 bucket, or the POSIX store directory",
	Long: `Create the repository the configuration names where it does not exist
yet: for repository_backend = "s3", the bucket [backend.s3] bucket names,
in [backend.s3] region, with the configured credentials (they need
s3:CreateBucket); for "posix_fs", the store directory and its layout. An
existing bucket or store is left as it is, so running it twice is safe.
It prints what it did.`,
	Args: cli.Args(cobra.NoArgs),
	RunE: func(cmd *cobra.Command, _ []string) error {
		cfg, err := env.Config()
		if err != nil {
			return err
		}
		did, err := node.InitRepository(cmd.Context(), cfg)
		if err != nil {
			return fmt.Errorf("store init: %w", err)
		}
		_, err = fmt.Fprintln(cmd.OutOrStdout(), did)
		return err
	},
}

func init() {
	storeCmd.AddCommand(storeInitCmd)
	rootCmd.AddCommand(storeCmd)
}
