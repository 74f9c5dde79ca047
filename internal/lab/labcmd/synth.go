package labcmd

import (
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/interrupt"
	"warmstart/internal/lab/synth"
	"warmstart/internal/layout"
)

// Synth is the synth verb.
func Synth() *cobra.Command {
	var (
		memorySize string
		out        string
		seed       uint64
		variants   int
		drift      float64
	)
	cmd := &cobra.Command{
		Use:   "synth --out DIR [--memory-size 128MiB] [--seed N] [--variants K --drift F]",
		Short: "Write the reference snapshot: memory file, vm state placeholder, layout and startup trace",
		Long: `Write a synthetic snapshot shaped like a Linux guest resuming to its agent:
DIR/memory.bin (guest memory), DIR/vm_state.bin (a placeholder), DIR/layout
(the memory layout as one "offset:size:pagesize" line, usable as --layout)
and DIR/startup.trace (the pages the guest touches until ready, in order).
The output is fully determined by the memory size and the seed.

--variants K --drift F also writes K start-up traces that drift from the
base one as a real guest's start-ups do, DIR/startup.variant-001.trace and
on: each drops a fraction F of the touched pages and touches as many others
in the same regions (runs drawn, per seed, from a finite set of alternative
paths, so pages recur across variants), in a locally perturbed order.
Variant k is determined by the memory size, the seed, F and k.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return cli.Error{Err: fmt.Errorf("synth: --out is required")}
			}
			size, err := layout.ParseSize(memorySize)
			if err != nil {
				return cli.Error{Err: fmt.Errorf("synth: --memory-size: %w", err)}
			}
			if size < synth.MinMemoryBytes || size > synth.MaxMemoryBytes || size%4096 != 0 {
				return cli.Error{Err: fmt.Errorf("synth: --memory-size %s: want a multiple of 4 KiB from %d MiB to %d GiB",
					memorySize, synth.MinMemoryBytes>>20, synth.MaxMemoryBytes>>30)}
			}
			if err := synth.CheckVariants(variants, drift); err != nil {
				return cli.Error{Err: fmt.Errorf("synth: --variants %d --drift %v: %w", variants, drift, err)}
			}
			// A signal stops the memory file's writing; Generate then
			// removes every file it had begun and leaves the directory's
			// earlier files as they were. One arriving after the memory
			// file is written lets the few small files that remain be
			// written; the run then succeeded.
			in := interrupt.Notify(cmd.ErrOrStderr())
			p, err := synth.Generate(in.Work, synth.Options{MemoryBytes: size, Seed: seed, Dir: out, Progress: cmd.OutOrStdout(),
				Variants: variants, Drift: drift})
			if stopped := in.Result(err); err != nil {
				return stopped
			}
			fmt.Fprintf(cmd.OutOrStdout(), "synth: wrote %s, %s, %s, %s\n", p.Memory, p.VMState, p.Layout, p.Trace)
			return nil
		},
	}
	cmd.Flags().StringVar(&memorySize, "memory-size", "128MiB", "guest memory size (a multiple of 4 KiB)")
	cmd.Flags().StringVar(&out, "out", "", "output directory (created if missing)")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "seed selecting one of the reference snapshots")
	cmd.Flags().IntVar(&variants, "variants", 0, fmt.Sprintf("also write this many drifting start-up traces, startup.variant-NNN.trace (at most %d; needs --drift)", synth.MaxVariants))
	cmd.Flags().Float64Var(&drift, "drift", 0, "fraction of touched pages each variant drops and replaces, from 0 to 1 (needs --variants)")
	return cmd
}
