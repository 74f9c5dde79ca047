package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/repository/s3"
)

var snapshotGCCmd = &cobra.Command{
	Use:   "gc",
	Short: "Remove what no snapshot needs any more from an S3 repository",
	Long: `Reclaim what deletes and crashed publishes left in an S3 repository: the
artifacts of publishes that never wrote their record (once older than a
day), and the memory chunks no snapshot references (once older than the
chunk grace of 6 hours; a deleted snapshot keeps its chunks that long for
restores still running on other nodes). It is safe to run while other
nodes publish, restore and delete. A POSIX store has nothing to collect:
it reclaims crashed publishes whenever it is opened.`,
	Args: argsAsUsageError(cobra.NoArgs),
	RunE: func(cmd *cobra.Command, _ []string) error {
		repo, err := openRepository(cmd)
		if err != nil {
			return fmt.Errorf("snapshot gc: %w", err)
		}
		out := cmd.OutOrStdout()
		r, ok := repo.(*s3.Repo)
		if !ok {
			_, err := fmt.Fprintln(out, "nothing to collect: a POSIX store keeps no shared chunks")
			return err
		}
		defer r.Close()
		if err := r.Sweep(cmd.Context()); err != nil {
			return fmt.Errorf("snapshot gc: %w", err)
		}
		st, err := r.CollectGarbage(cmd.Context())
		if err != nil {
			return fmt.Errorf("snapshot gc: %w", err)
		}
		_, err = fmt.Fprintf(out, "%d chunks: %d in use, %d unused but within their grace, %d removed (%d bytes); %d tombstones removed\n",
			st.Chunks, st.Live, st.Young, st.Removed, st.RemovedBytes, st.Tombstones)
		return err
	},
}

func init() {
	snapshotCmd.AddCommand(snapshotGCCmd)
}
