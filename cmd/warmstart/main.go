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
	"strings"

	"github.com/spf13/cobra"

	"warmstart/internal/bench"
	"warmstart/internal/config"
	"warmstart/internal/interrupt"
	"warmstart/internal/role"
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
	rootCmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
}

// loadConfig loads the configuration file config.Path resolves from
// --config: --config, else $WARMSTART_CONFIG, else /etc/warmstart/config.toml
// when present, else the built-in defaults.
func loadConfig() (*config.Config, error) { return config.Load(config.Path(configPath)) }

// usageError marks an error caused by how the verb was called, so main can
// exit 2 as the shell convention asks.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

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
	// cobra adds help and completion itself at Execute; add them now so
	// that they too refuse unknown arguments as usage errors.
	rootCmd.InitDefaultHelpCmd()
	rootCmd.InitDefaultCompletionCmd()
	for _, c := range rootCmd.Commands() {
		if c.Name() == "help" {
			c.Args = knownHelpTopic
		}
	}
	markArgErrorsAsUsage(rootCmd)
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
		os.Exit(1)
	}
}

// markArgErrorsAsUsage makes every wrong positional argument below c a
// usage error. A verb that only groups others gets a RunE, because cobra
// never checks the arguments of a verb it cannot run: it would print the
// group's help for "snapshot lst" and succeed. Without arguments such a
// verb still prints its help.
func markArgErrorsAsUsage(c *cobra.Command) {
	for _, sub := range c.Commands() {
		markArgErrorsAsUsage(sub)
	}
	if c.HasSubCommands() && !c.Runnable() {
		c.Args = unknownCommand
		c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	}
	if c.Args != nil {
		c.Args = argsAsUsage(c.Args)
	}
}

// argsAsUsage marks the errors of check as usage errors, leaving those
// already marked as they are.
func argsAsUsage(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		err := check(cmd, args)
		var ue usageError
		if err != nil && !errors.As(err, &ue) {
			return usageError{err}
		}
		return err
	}
}

// unknownCommand refuses any argument to a verb that only groups others:
// the first names no verb of the group.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if !cmd.DisableSuggestions {
		if cmd.SuggestionsMinimumDistance <= 0 {
			cmd.SuggestionsMinimumDistance = 2 // cobra's own default
		}
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + quotedList(s) + "?"
		}
	}
	return usageError{fmt.Errorf("%s (see %s --help)", msg, cmd.CommandPath())}
}

// knownHelpTopic refuses "help TOPIC" when TOPIC names no verb, where
// cobra would print the closest group's help and succeed.
func knownHelpTopic(cmd *cobra.Command, args []string) error {
	target, rest, err := cmd.Root().Find(args)
	if err != nil {
		return usageError{fmt.Errorf("help: %w", err)}
	}
	if len(rest) > 0 {
		return fmt.Errorf("help: %w", unknownCommand(target, rest))
	}
	return nil
}

// quotedList renders names as "a", "b" or "c".
func quotedList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	if len(q) == 1 {
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
