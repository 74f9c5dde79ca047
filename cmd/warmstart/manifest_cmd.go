package main

import (
	"errors"

	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/lab/chart"
	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/repository"
)

var manifestCmd = &cobra.Command{
	Use:   "manifest",
	Short: "Work with startup manifest files",
	Long: `A startup manifest lists the guest memory ranges a restore of one snapshot
touched, in first-touch order, until the guest agent was ready. warmstart
records it after a snapshot is published and prefetches its ranges on later
restores. It is a small versioned binary file whose SHA-256 digest the
snapshot record keeps.`,
}

var (
	manifestInspectJSON    bool
	manifestInspectVerbose bool
	manifestPlot           string
)

var manifestInspectCmd = &cobra.Command{
	Use:     "inspect FILE|ID|ALIAS",
	Aliases: []string{"show"},
	Short:   "Decode a startup manifest and print its layout, ranges and digest",
	Long: `Decode and validate a startup manifest file, then print its format version,
the memory layout it was recorded against, the number of ranges and the bytes
they cover, the SHA-256 digest of the file (what a snapshot record's
descriptor holds) and the ranges in first-touch order: the first 20, or all
with --verbose. --json prints everything, every range included, as JSON.
The argument is a manifest file or, when no such file (or only a directory
of that name) exists, the id or alias of a snapshot whose attached manifest
is read (checked against the record's digest). --plot FILE.svg|.png draws the memory map, each touched
page coloured by its first-touch rank, and the cumulative startup bytes
against first-touch rank.

A file that is not a valid manifest (truncated, bad magic number, unknown
version, overlapping, unaligned or out-of-layout ranges, over 16 MiB) is an
error naming the file and the rule it breaks.`,
	Args: cli.Args(cobra.ExactArgs(1)),
	RunE: func(cmd *cobra.Command, args []string) error {
		if args[0] == "" {
			return usageError{Err: errors.New("manifest inspect: the manifest argument is empty: give a FILE, ID or ALIAS")}
		}
		if err := cli.CheckFileFlag("--plot", manifestPlot, chart.CheckPath); err != nil {
			return err
		}
		path, data, m, err := ops.InspectManifest(cmd.Context(), args[0], func() (repository.Repository, error) {
			return env.OpenReadOnlyRepository(cmd)
		})
		if err != nil {
			return err
		}
		if manifestPlot != "" {
			if err := chart.Manifest(manifestPlot, m); err != nil {
				return err
			}
		}
		return report.Manifest(cmd.OutOrStdout(), path, data, m, manifestInspectJSON, manifestInspectVerbose)
	},
}

func init() {
	manifestInspectCmd.Flags().BoolVar(&manifestInspectJSON, "json", false, "print the manifest as JSON, every range included")
	manifestInspectCmd.Flags().BoolVar(&manifestInspectVerbose, "verbose", false, "list every range, not only the first 20")
	manifestInspectCmd.Flags().StringVar(&manifestPlot, "plot", "", "draw the memory map and cumulative bytes to FILE.svg or FILE.png")
	manifestInspectCmd.Flags().String(cli.StoreFlag, "", "POSIX snapshot store directory, for an id or alias (overrides [backend.posix_fs] snapshot_store)")
	manifestCmd.AddCommand(manifestInspectCmd)
	rootCmd.AddCommand(manifestCmd)
}
