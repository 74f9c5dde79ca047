package labcmd

import (
	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/interrupt"
	"warmstart/internal/lab/bench"
	"warmstart/internal/lab/demo"
)

// Demo is the demo verb.
func Demo() *cobra.Command {
	var blocks int
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole job on the reference snapshot, in a temporary directory",
		Long: `Synthesize the reference snapshot, publish it to a temporary POSIX
repository, record its startup manifest in the background and show it
attached, restore it cold with prefetch off and then on, run a short
benchmark, print the table, and remove everything. Needs root (FUSE).`,
		Args: cli.Args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Refused before the reference is synthesized, not at step 5.
			if err := bench.CheckBlocks("blocks", blocks, 1); err != nil {
				return cli.Error{Err: err}
			}
			in := interrupt.Notify(cmd.ErrOrStderr())
			return in.Result(demo.Run(in.Work, in.Force, cmd.OutOrStdout(), blocks))
		},
	}
	cmd.Flags().IntVar(&blocks, "blocks", 3, "blocks of the closing benchmark")
	return cmd
}
