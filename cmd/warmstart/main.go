// Command warmstart keeps microVM snapshots in a repository, serves their
// memory through a memory device, records the startup manifest of each
// snapshot and prefetches it on restore. Every verb has --help.
//
// A verb parses its flags, calls an operation of package ops in this
// process, or the daemon through api.Client with --daemon, and prints
// through package report, the same thing either way. Package cli holds the
// plumbing the verbs share.
package main

import (
	"os"

	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/lab/bench"
	"warmstart/internal/lab/labcmd"
	"warmstart/internal/reexec"
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

// env is the --config and --daemon flags and the configuration every verb
// loads from them, once per run.
var env cli.Env

func init() {
	env.Register(rootCmd)
	// The lab's verbs: a built-in benchmark and demo are features.
	rootCmd.AddCommand(labcmd.Bench(&env), labcmd.Demo(), labcmd.Synth(), labcmd.ReplayVMM())
	// Declared here so that cobra does not also claim -v for it.
	rootCmd.Flags().Bool("version", false, "print the version and exit")
	rootCmd.SetVersionTemplate("{{.Version}}")
	rootCmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{Err: err} })
}

// usageError marks an error caused by how the verb was called, so main can
// exit 2 as the shell convention asks.
type usageError = cli.Error

// roles are the parts this executable plays besides the CLI, chosen by
// reexec.Env: warmstart re-executes itself as each of them.
var roles = reexec.Roles{
	replay.RoleReplayVMM: replay.ChildMain,  // the replay VMM a restore starts
	qemu.RoleLauncher:    qemu.LauncherMain, // denies QEMU huge-page advice, then execs QEMU
	bench.RoleTrial:      bench.TrialMain,   // one trial of the benchmark, in its own process
}

func main() {
	// Before anything reads the arguments: a role's are not the CLI's.
	roles.Dispatch()
	cli.MarkTree(rootCmd)
	env.RegisterCompletions(rootCmd)
	stdout := &cli.Stdout{W: os.Stdout}
	rootCmd.SetOut(stdout)
	if cmd, err := rootCmd.ExecuteC(); err != nil {
		os.Exit(cli.ReportFailure(cmd, os.Args[1:], err, stdout, os.Stderr))
	}
}
