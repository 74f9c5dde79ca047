package main

import (
	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/ops"
)

var snapshotFlattenFlags struct {
	full, json bool
}

var snapshotFlattenCmd = &cobra.Command{
	Use:   "flatten ID|ALIAS [--full] [--json]",
	Short: "Merge a paused snapshot's memory layers, in place",
	Long: `A snapshot paused from a running restore keeps only the pages its guest changed,
as a layer over its parent's memory; a chain of such snapshots reads every
layer down to a full memory file. Flatten rewrites the snapshot's memory,
for the same bytes, under the same id: its diff layers merged into one over
its base (reads resolve in at most two layers again), or with --full one
whole memory file that depends on no ancestor, so the ancestors can be
deleted.

Every byte is read through the verified chain (each layer checked against
its table of SHA-256 digests) and the new memory is stored under new names
before the record names it; the old layer goes after. A snapshot that other
snapshots depend on is refused: its layers are theirs too (flatten the
leaves). A signed snapshot is signed again with [trust] signing_key; one
this node cannot sign is refused rather than left unsigned.

Exit status: 0 when the snapshot was flattened or had nothing to flatten,
1 otherwise, 2 for a usage error.`,
	Args: cli.Args(cobra.ExactArgs(1)),
	RunE: func(cmd *cobra.Command, args []string) error {
		return env.Flatten(cmd, args[0], ops.FlattenOptions{Full: snapshotFlattenFlags.full}, snapshotFlattenFlags.json)
	},
}

func init() {
	fl := snapshotFlattenCmd.Flags()
	fl.BoolVar(&snapshotFlattenFlags.full, "full", false, "write one whole memory file that depends on no ancestor")
	fl.BoolVar(&snapshotFlattenFlags.json, "json", false, "print the result as JSON")
	cli.HideDaemonInHelp(snapshotFlattenCmd)
	snapshotCmd.AddCommand(snapshotFlattenCmd)
}
