package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/layout"
	"warmstart/internal/synth"
)

func init() {
	var (
		memorySize string
		out        string
		seed       uint64
	)
	cmd := &cobra.Command{
		Use:   "synth --out DIR [--memory-size 128MiB] [--seed N]",
		Short: "Write the reference snapshot: memory file, vm state placeholder, layout and startup trace",
		Long: `Write a synthetic snapshot shaped like a Linux guest resuming to its agent:
DIR/memory.bin (guest memory), DIR/vm_state.bin (a placeholder), DIR/layout
(the memory layout as one "offset:size:pagesize" line, usable as --layout)
and DIR/startup.trace (the pages the guest touches until ready, in order).
The output is fully determined by the memory size and the seed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usageError{Err: fmt.Errorf("synth: --out is required")}
			}
			size, err := layout.ParseSize(memorySize)
			if err != nil {
				return usageError{Err: fmt.Errorf("synth: --memory-size: %w", err)}
			}
			if size < synth.MinMemoryBytes || size > synth.MaxMemoryBytes {
				return usageError{Err: fmt.Errorf("synth: --memory-size %s: want %d MiB to %d GiB", memorySize, synth.MinMemoryBytes>>20, synth.MaxMemoryBytes>>30)}
			}
			p, err := synth.Generate(synth.Options{MemoryBytes: size, Seed: seed, Dir: out, Progress: cmd.OutOrStdout()})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "synth: wrote %s, %s, %s, %s\n", p.Memory, p.VMState, p.Layout, p.Trace)
			return nil
		},
	}
	cmd.Flags().StringVar(&memorySize, "memory-size", "128MiB", "guest memory size (a multiple of 4 KiB)")
	cmd.Flags().StringVar(&out, "out", "", "output directory (created if missing)")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "seed selecting one of the reference snapshots")
	rootCmd.AddCommand(cmd)
}
