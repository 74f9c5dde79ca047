// Command warmstart keeps microVM snapshots in a repository, serves their
// memory through a memory device, records the startup manifest of each
// snapshot and prefetches it on restore. Every verb has --help.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// rootCmd is the verb tree. Each file of this package adds its verbs in init.
var rootCmd = &cobra.Command{
	Use:           "warmstart",
	Short:         "Fast microVM snapshot restores through startup-manifest prefetch",
	SilenceUsage:  true,
	SilenceErrors: true,
}

// configPath is the --config flag shared by every verb.
var configPath string

func init() {
	rootCmd.PersistentFlags().StringVar(&configPath, "config", "", "TOML configuration file (default: built-in defaults)")
}

// usageError marks an error caused by how the verb was called, so main can
// exit 2 as the shell convention asks.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	rootCmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "warmstart: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		var ie interruptedError
		if errors.As(err, &ie) {
			os.Exit(ie.exitCode())
		}
		os.Exit(1)
	}
}
