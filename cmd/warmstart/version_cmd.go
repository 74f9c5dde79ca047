package main

import (
	"fmt"
	"runtime/debug"

	"warmstart/internal/cli"
	"warmstart/internal/report"

	"github.com/spf13/cobra"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the module version, VCS revision and Go version of this binary (as --version does)",
		Args:  cli.Args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprint(cmd.OutOrStdout(), buildVersion())
			return err
		},
	})
}

// buildVersion describes this binary from what the go command stamped
// into it.
func buildVersion() string {
	bi, _ := debug.ReadBuildInfo()
	return report.Version(bi)
}
