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
	"warmstart/internal/repository/s3"
)

var snapshotGCCmd = &cobra.Command{
	Use:   "gc",
	Short: "Remove what no snapshot needs any more from an S3 repository",
	Long: fmt.Sprintf(`Reclaim what deletes and crashed publishes left in an S3 repository: the
artifacts of publishes that never wrote their record (once their capture
lease has gone unrenewed for %d minutes: a publish still running, on any
node, keeps renewing it and is never touched), and the memory chunks no
snapshot references (once older than the chunk grace of 6 hours and than
every publish still running; a deleted snapshot keeps its chunks that
long for restores still running on other nodes). It is safe to run while
other nodes publish, restore and delete. A snapshot it cannot read keeps all
it has: gc goes on with the others, lists each such one, and exits non-zero.
A POSIX store has nothing to collect: it reclaims crashed publishes whenever
it is opened.`, s3.AbandonedPublishGraceMinutes),
	Args: cli.Args(cobra.NoArgs),
	RunE: func(cmd *cobra.Command, _ []string) error {
		if env.Daemon != "" {
			// Inherited from "snapshot": collecting in this process instead
			// would ignore the operator's choice without a word.
			return usageError{Err: errors.New("snapshot gc has no --daemon: it runs in this process, on the repository its configuration names")}
		}
		repo, err := env.OpenRepository(cmd)
		if err != nil {
			return err
		}
		if c, ok := repo.(io.Closer); ok {
			defer c.Close()
		}
		return cli.Interruptible(cmd, func(ctx context.Context) error {
			st, collected, err := ops.CollectGarbage(ctx, repo)
			return report.Collected(cmd.OutOrStdout(), st, collected, err)
		})
	},
}

func init() {
	snapshotCmd.AddCommand(snapshotGCCmd)
}
