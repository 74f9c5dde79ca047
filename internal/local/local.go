// Package local runs the CLI's verbs in this process, on a repository or a
// node the caller opened, and prints through package report: the
// in-process twin of package remote, so both read alike. Errors name the
// verb and the snapshot; a malformed id or alias keeps
// repository.ErrInvalidRequest in the chain, so the caller can report it as
// a usage error.
package local

import (
	"context"
	"errors"
	"fmt"

	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/repository"
	"warmstart/internal/trust"
)

// RefError names the snapshot a verb failed on. Not-found needs no more
// than that.
func RefError(verb, ref string, err error) error {
	if se := (*ops.SnapshotError)(nil); errors.As(err, &se) {
		err = se.Err
	}
	switch {
	case errors.Is(err, repository.ErrNotFound):
		return fmt.Errorf("%s %s: %w", verb, ref, repository.ErrNotFound)
	case errors.Is(err, repository.ErrInvalidRequest):
		return fmt.Errorf("%s %q: %w", verb, ref, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s %s: interrupted: %w", verb, ref, err)
	}
	return fmt.Errorf("%s %s: %w", verb, ref, err)
}

// Show prints the record of the snapshot ref names, what policy (the
// node's trusted keys) makes of it and, when its artifacts check out,
// where its files are.
func Show(ctx context.Context, repo repository.Repository, policy *trust.Policy, o report.Output, ref string, asJSON bool) error {
	info, err := ops.Show(ctx, repo, policy, ref)
	if err != nil {
		return RefError("snapshot show", ref, err)
	}
	return report.Snapshot(o.Out, info, asJSON)
}

// Delete deletes the snapshot ref names (repository.DeleteRef): one that
// does not exist is reported, not an error, after reclaiming what a
// crashed publish or delete of that id left; an alias naming a snapshot
// that no longer exists is released.
func Delete(ctx context.Context, repo repository.Repository, o report.Output, ref string) error {
	del, err := ops.Delete(ctx, repo, ref)
	if err != nil {
		return RefError("snapshot delete", ref, err)
	}
	return report.Deletion(o.Out, ref, del)
}

// List prints the catalog filter f selects (see report.Catalog).
func List(ctx context.Context, repo repository.Repository, o report.Output, f repository.Filter, asJSON, check bool) error {
	rows, _, err := ops.List(ctx, repo, f)
	if err != nil {
		return fmt.Errorf("snapshot list: %w", err)
	}
	return report.Catalog(o, rows, asJSON, check)
}
