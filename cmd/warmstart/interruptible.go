package main

import (
	"context"

	"github.com/spf13/cobra"

	"warmstart/internal/interrupt"
)

// interruptible runs a verb's long work (an import's copy, a verify's
// read, a recording with its devices mounted, a collection) under
// interrupt's watch: SIGINT or SIGTERM cancels ctx, so the work removes
// what it had begun (a publish its snapshot directory and temporary
// files, a recording its mounts) before the verb exits 128+signal,
// instead of the process dying by the signal half-way. run opens what
// it needs itself, so that a signal is watched for from the start.
func interruptible(cmd *cobra.Command, run func(ctx context.Context) error) error {
	in := interrupt.Notify(cmd.ErrOrStderr())
	return in.Result(run(in.Work))
}
