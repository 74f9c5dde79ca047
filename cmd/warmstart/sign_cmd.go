package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/trust"
)

var snapshotSignAll bool

var snapshotSignCmd = &cobra.Command{
	Use:   "sign ID|ALIAS | --all",
	Short: "Sign published snapshots with [trust] signing_key",
	Long: `Add a signature by [trust] signing_key to the record of the snapshot with that
id or alias (with --all, of every snapshot), replacing one by the same key.
Nodes that list the key's public half in [trust] trusted_keys then restore
it. Signatures by other keys stay: this is how a key is rotated (see
warmstart key --help), and how snapshots published before signing, or
unsigned by a publisher without a key, come to be signed.

A signature vouches for the record's core: its ids and layout, every
artifact's size and SHA-256, the digest table that names every 4 KiB
block's SHA-256, the chunk map and the memory format. So the snapshot is
signed only once that is known to be so: when a key this node trusts
([trust] trusted_keys) already signed the record as it is, at once;
otherwise after every artifact was read whole and matched the record, as
warmstart snapshot verify reads them (a snapshot without a digest table, or
with one of CRC-32C digests, first gets the SHA-256 table of that read, as
with --add-digests). A snapshot with problems is not signed. Progress goes
to stderr, one line per signed snapshot to stdout.

It runs in this process only (no --daemon): the key is this host's.
Exit status: 0 when every snapshot was signed, 1 otherwise, 2 for a usage
error.`,
	Args: cli.Args(cli.OptionalSnapshotArg),
	RunE: runSnapshotSign,
}

func runSnapshotSign(cmd *cobra.Command, args []string) error {
	if env.Daemon != "" {
		return usageError{Err: errors.New("snapshot sign has no --daemon: it signs with this host's [trust] signing_key, in this process")}
	}
	if snapshotSignAll == (len(args) == 1) {
		return usageError{Err: errors.New("snapshot sign: give one ID or ALIAS, or --all")}
	}
	cfg, err := env.Config()
	if err != nil {
		return err
	}
	if cfg.Trust.SigningKey == "" {
		return usageError{Err: errors.New("snapshot sign: no [trust] signing_key is configured")}
	}
	key, err := trust.LoadPrivate(cfg.Trust.SigningKey)
	if err != nil {
		return fmt.Errorf("snapshot sign: %w", err)
	}
	policy, err := env.TrustPolicy()
	if err != nil {
		return fmt.Errorf("snapshot sign: %w", err)
	}
	repo, err := env.OpenRepository(cmd)
	if err != nil {
		return fmt.Errorf("snapshot sign: %w", err)
	}
	if c, ok := repo.(io.Closer); ok {
		defer c.Close()
	}
	s := ops.Signer{Key: key, Policy: policy, Progress: report.VerifyProgress(cmd.ErrOrStderr())}
	ref := ""
	if len(args) == 1 {
		ref = args[0]
	}
	return cli.Interruptible(cmd, func(ctx context.Context) error {
		err := ops.Sign(ctx, repo, s, ref, snapshotSignAll, func(r ops.Signed) {
			if r.Err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "warmstart: %v\n", r.Err)
				return
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\tsigned with key %s (%s)\n", r.ID, key.ID(), r.How)
		})
		return cli.InvalidAsUsage(cli.OpError("snapshot sign", ref, err))
	})
}

func init() {
	snapshotSignCmd.Flags().BoolVar(&snapshotSignAll, "all", false, "sign every snapshot")
	cli.HideDaemonInHelp(snapshotSignCmd)
	snapshotCmd.AddCommand(snapshotSignCmd)
}
