package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/interrupt"
	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/repository"
)

// Output is where cmd prints.
func Output(cmd *cobra.Command) report.Output {
	return report.Output{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()}
}

// Interruptible runs a verb's long work (an import's copy, a verify's
// read, a recording with its devices mounted, a collection) under
// interrupt's watch: SIGINT or SIGTERM cancels ctx, so the work removes
// what it had begun (a publish its snapshot directory and temporary
// files, a recording its mounts) before the verb exits 128+signal,
// instead of the process dying by the signal half-way. run opens what
// it needs itself, so that a signal is watched for from the start.
func Interruptible(cmd *cobra.Command, run func(ctx context.Context) error) error {
	in := interrupt.Notify(cmd.ErrOrStderr())
	return in.Result(run(in.Work))
}

// SnapshotArg accepts one argument naming a snapshot by id or alias
// (repository.ValidateRef): a name no snapshot can have is refused before
// a store, a daemon or a device is touched, as the verb's usage error, and
// never reported as a snapshot that was not found.
func SnapshotArg(cmd *cobra.Command, args []string) error {
	if err := cobra.ExactArgs(1)(cmd, args); err != nil {
		return err
	}
	return checkSnapshotRef(args[0])
}

// OptionalSnapshotArg is SnapshotArg for a verb whose snapshot may be left
// out.
func OptionalSnapshotArg(cmd *cobra.Command, args []string) error {
	if err := cobra.MaximumNArgs(1)(cmd, args); err != nil || len(args) == 0 {
		return err
	}
	return checkSnapshotRef(args[0])
}

func checkSnapshotRef(ref string) error {
	if ref == "" {
		return errors.New("the snapshot argument is empty: give an ID or ALIAS")
	}
	return repository.ValidateRef(ref)
}

// RefError names the snapshot a verb failed on; not-found needs no more
// than that. A malformed id or alias is a usage error.
func RefError(verb, ref string, err error) error {
	if se := (*ops.SnapshotError)(nil); errors.As(err, &se) {
		err = se.Err
	}
	switch {
	case errors.Is(err, repository.ErrNotFound):
		return fmt.Errorf("%s %s: %w", verb, ref, repository.ErrNotFound)
	case errors.Is(err, repository.ErrInvalidRequest):
		return Error{Err: fmt.Errorf("%s %q: %w", verb, ref, err)}
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s %s: interrupted: %w", verb, ref, err)
	}
	return fmt.Errorf("%s %s: %w", verb, ref, err)
}

// OpError is how a verb on ref reports an operation's err: in RefError's
// words when the operation could not find or resolve the snapshot
// (*ops.SnapshotError), as it is otherwise.
func OpError(verb, ref string, err error) error {
	if se := (*ops.SnapshotError)(nil); errors.As(err, &se) {
		return RefError(verb, ref, se)
	}
	return err
}

// InvalidAsUsage makes a malformed id or alias, and a request field
// refused (*ops.FieldError), usage errors.
func InvalidAsUsage(err error) error {
	if errors.Is(err, repository.ErrInvalidRequest) || errors.As(err, new(*ops.FieldError)) {
		return Error{Err: err}
	}
	return err
}

// CheckFileFlag refuses, as a usage error naming flag, an output file the
// verb could not write where path says (check says why), before any work:
// the file is written after the work it reports. An empty path is no file.
func CheckFileFlag(flag, path string, check func(string) error) error {
	if path == "" {
		return nil
	}
	if err := check(path); err != nil {
		return Error{Err: fmt.Errorf("%s: %w", flag, err)}
	}
	return nil
}
