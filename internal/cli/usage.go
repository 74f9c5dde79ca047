package cli

// The errors a caller of a cobra command tree causes — an unknown flag or
// verb, wrong positional arguments, an unknown help topic — are usage
// errors, so the executable exits 2 for them as the shell convention asks,
// and never prints a group's help and succeeds instead.

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"warmstart/internal/api"
	"warmstart/internal/interrupt"
	"warmstart/internal/trust"

	"github.com/spf13/cobra"
)

// Exit statuses besides 0, 1 and 128+signal.
const (
	// ExitUsage is a verb called wrongly, as the shell convention asks.
	ExitUsage = 2
	// ExitUntrusted is a verb refused a snapshot because none of the
	// node's trusted keys signed it ([trust] trusted_keys), so scripts
	// tell it from a failure worth retrying.
	ExitUntrusted = 3
	// ExitStopFailed is "restores snapshot --then stop" whose child was
	// published and whose stop then failed (ErrStopAfterPause): the child
	// exists, so a script must not pause again, and the restore may need
	// looking at.
	ExitStopFailed = 4
	// ExitCannotStore is a disk that refused to store what the verb
	// wrote: no space or quota left, or a read-only file system (a
	// daemon's 507). Retrying will not help until an operator frees
	// space or mounts it read-write.
	ExitCannotStore = 5
	// ExitUnavailable is a store that did not answer, or a daemon that
	// answered 503 (its store did not answer, or it is shutting down):
	// the same command may succeed later.
	ExitUnavailable = 6
)

// ExitCode is the status a verb that failed with err exits with: 2 for a
// usage error, 128+signal for one a signal stopped, 3 for an untrusted
// snapshot, 4 for a stop that failed after a published pause, 5 and 6
// for a disk that takes no writes and a store that does not answer
// (decided as the daemon decides its 507 and 503, whose answers map to
// them), 1 otherwise.
func ExitCode(err error) int {
	var ie interrupt.Error
	switch {
	case errors.As(err, new(Error)):
		return ExitUsage
	case errors.As(err, &ie):
		return ie.ExitCode()
	case errors.Is(err, trust.ErrUntrusted):
		return ExitUntrusted
	case errors.Is(err, ErrStopAfterPause):
		return ExitStopFailed
	}
	switch api.UnavailableStatus(err) {
	case http.StatusInsufficientStorage:
		return ExitCannotStore
	case http.StatusServiceUnavailable:
		return ExitUnavailable
	}
	return 1
}

// Error marks an error caused by how the verb was called.
type Error struct{ Err error }

func (e Error) Error() string { return e.Err.Error() }
func (e Error) Unwrap() error { return e.Err }

// MarkTree makes every argument error below root a usage error, help and
// completion included: cobra adds those two at Execute, so they are added
// here first.
func MarkTree(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "help" {
			c.Args = knownHelpTopic
		}
	}
	markArgErrorsAsUsage(root)
}

// verbName is how an error names cmd: main prefixes the program's name,
// so the verb is named without it ("restores list").
func verbName(cmd *cobra.Command) string {
	return strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
}

// Args is check with its errors marked as usage errors naming the verb.
func Args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			// The usage line says which arguments it takes (ID|ALIAS).
			return Error{Err: fmt.Errorf("%s: %w; usage: %s", verbName(cmd), err, strings.TrimSuffix(cmd.UseLine(), " [flags]"))}
		}
		return nil
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
		c.Args = markArgs(c.Args)
	}
}

// markArgs marks the errors of check as usage errors, leaving those
// already marked as they are.
func markArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		err := check(cmd, args)
		var ue Error
		if err != nil && !errors.As(err, &ue) {
			return Error{Err: err}
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
	return Error{Err: fmt.Errorf("%s (see %s --help)", msg, cmd.CommandPath())}
}

// knownHelpTopic refuses "help TOPIC" when TOPIC names no verb, where
// cobra would print the closest group's help and succeed.
func knownHelpTopic(cmd *cobra.Command, args []string) error {
	target, rest, err := cmd.Root().Find(args)
	if err != nil {
		return Error{Err: fmt.Errorf("help: %w", err)}
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
