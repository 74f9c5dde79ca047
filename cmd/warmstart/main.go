// Command warmstart keeps microVM snapshots in a repository, serves their
// memory through a memory device, records the startup manifest of each
// snapshot and prefetches it on restore. Every verb has --help.
//
// A verb parses its flags, calls one function of an internal package and
// prints through package report; with --daemon it runs through package
// remote instead, printing the same thing.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"warmstart/internal/bench"
	"warmstart/internal/config"
	"warmstart/internal/interrupt"
	"warmstart/internal/role"
	"warmstart/internal/trust"
	"warmstart/internal/usage"
	"warmstart/internal/vmm/qemu"
	"warmstart/internal/vmm/replay"
)

// rootCmd is the verb tree. Each file of this package adds its verbs in init.
var rootCmd = &cobra.Command{
	Use:           "warmstart",
	Short:         "Fast microVM snapshot restores through startup-manifest prefetch",
	Version:       buildVersion(),
	SilenceUsage:  true,
	SilenceErrors: true,
}

// configPath is the --config flag shared by every verb.
var configPath string

func init() {
	rootCmd.PersistentFlags().StringVar(&configPath, "config", "",
		"TOML configuration file (default: $"+config.EnvFile+", else "+config.SystemFile+" when present, else the built-in defaults)")
	// Declared here so that cobra does not also claim -v for it.
	rootCmd.Flags().Bool("version", false, "print the version and exit")
	rootCmd.SetVersionTemplate("{{.Version}}")
	rootCmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{Err: err} })
}

// loadConfig loads the configuration file config.Path resolves from
// --config: --config, else $WARMSTART_CONFIG, else /etc/warmstart/config.toml
// when present, else the built-in defaults.
func loadConfig() (*config.Config, error) { return config.Load(config.Path(configPath)) }

// exitUntrusted is the exit status of a verb refused a snapshot because
// none of the node's trusted keys signed it ([trust] trusted_keys), so
// scripts tell it from a failure worth retrying.
const exitUntrusted = 3

// usageError marks an error caused by how the verb was called, so main can
// exit 2 as the shell convention asks.
type usageError = usage.Error

// roles are the parts this executable plays besides the CLI, chosen by
// role.Env: warmstart re-executes itself as each of them.
var roles = role.Roles{
	replay.RoleReplayVMM: replay.ChildMain,  // the replay VMM a restore starts
	qemu.RoleLauncher:    qemu.LauncherMain, // denies QEMU huge-page advice, then execs QEMU
	bench.RoleTrial:      bench.TrialMain,   // one trial of the benchmark, in its own process
}

func main() {
	// Before anything reads the arguments: a role's are not the CLI's.
	roles.Dispatch()
	usage.MarkTree(rootCmd)
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "warmstart: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		var ie interrupt.Error
		if errors.As(err, &ie) {
			os.Exit(ie.ExitCode())
		}
		if errors.Is(err, trust.ErrUntrusted) {
			os.Exit(exitUntrusted)
		}
		os.Exit(1)
	}
}
