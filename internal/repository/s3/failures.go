package s3

import (
	"context"
	"fmt"
	"strings"
)

// A sweep or a collection goes through the snapshots one by one; what it
// cannot read or remove on one of them (a record the store refuses, a
// removal that fails) is that snapshot's failure, not the whole run's:
// everything of that snapshot whose state could not be read stays, the
// others are collected, and the run ends with an IncompleteError naming
// every failure. Only what concerns the whole run (listing the bucket,
// reading the chunk maps every chunk's fate depends on, a context that
// ended) stops it.

// SnapshotError is a sweep's or a collection's failure on one snapshot.
type SnapshotError struct {
	// ID is the snapshot's id, or "alias A" for an alias binding.
	ID string
	// Step is what the run was doing there.
	Step string
	Err  error
}

func (e SnapshotError) Error() string { return fmt.Sprintf("%s: %s: %v", e.ID, e.Step, e.Err) }
func (e SnapshotError) Unwrap() error { return e.Err }

// IncompleteError is the answer of a sweep or a collection that went on
// past failures on some snapshots, keeping what it could not read there.
type IncompleteError struct {
	Failed []SnapshotError
}

func (e *IncompleteError) Error() string {
	msgs := make([]string, len(e.Failed))
	for i, f := range e.Failed {
		msgs[i] = f.Error()
	}
	return fmt.Sprintf("%s not collected (what could not be read kept): %s", e.Count(), strings.Join(msgs, "; "))
}

// Count says how many snapshots (or alias bindings) failed: "1 snapshot",
// "3 snapshots".
func (e *IncompleteError) Count() string {
	ids := map[string]bool{}
	for _, f := range e.Failed {
		ids[f.ID] = true
	}
	if len(ids) == 1 {
		return "1 snapshot"
	}
	return fmt.Sprintf("%d snapshots", len(ids))
}

// failures collects the failures of one run.
type failures struct {
	list []SnapshotError
}

// add records err as id's failure at step and returns nil so the run goes
// on, unless ctx has ended: then err ends the run.
func (f *failures) add(ctx context.Context, id, step string, err error) error {
	if ctx.Err() != nil {
		return ctxErr(ctx, err)
	}
	f.list = append(f.list, SnapshotError{ID: id, Step: step, Err: err})
	return nil
}

// err is the run's answer: nil without failures.
func (f *failures) err() error {
	if len(f.list) == 0 {
		return nil
	}
	return &IncompleteError{Failed: f.list}
}
