package repository

import (
	"context"
	"errors"
	"fmt"
)

// AliasMismatch is an alias binding and a record that contradict each
// other: the binding of Alias names snapshot BoundTo ("" when Alias is
// unbound), while the record of snapshot ID carries alias Carries ("" for
// none). It comes in two forms:
//
//   - the binding names a record that carries another alias, or none
//     (BoundTo == ID, Carries != Alias): Lookup of the alias answers
//     DanglingNotCarried, and BindingMismatch finds it;
//   - a record carries an alias that is not bound to it (Carries == Alias,
//     BoundTo != ID): RecordMismatch finds it from the record.
//
// A publish binds its alias before it writes its record, and a delete
// removes the record before the binding, so neither form is a state a
// writer passes through: both are damage an operator should see.
type AliasMismatch struct {
	Alias   string `json:"alias"`
	BoundTo string `json:"bound_to,omitempty"`
	ID      string `json:"id"`
	Carries string `json:"carries,omitempty"`
}

func (m AliasMismatch) String() string {
	if m.BoundTo == m.ID {
		carried := "no alias"
		if m.Carries != "" {
			carried = fmt.Sprintf("alias %q", m.Carries)
		}
		return fmt.Sprintf("alias %s names snapshot %s, whose record carries %s", m.Alias, m.ID, carried)
	}
	if m.BoundTo == "" {
		return fmt.Sprintf("the record of snapshot %s carries alias %q, which is bound to no snapshot", m.ID, m.Alias)
	}
	return fmt.Sprintf("the record of snapshot %s carries alias %q, which is bound to snapshot %s", m.ID, m.Alias, m.BoundTo)
}

// BindingMismatch is the mismatch err, an error of looking an alias up,
// reports: a binding naming a record that carries another alias (or
// none). Lookup calls that "not found", since the next publisher of the
// alias takes the binding over; an operator who asked for the alias is
// told the catalog contradicts itself. ok is false for any other error,
// and when the record can no longer be read.
func BindingMismatch(ctx context.Context, repo Repository, err error) (m AliasMismatch, ok bool) {
	var d *DanglingAlias
	if !errors.As(err, &d) || d.Why != DanglingNotCarried {
		return AliasMismatch{}, false
	}
	rec, gerr := repo.Get(ctx, d.ID)
	if gerr != nil || rec.Alias == d.Alias {
		return AliasMismatch{}, false
	}
	return AliasMismatch{Alias: d.Alias, BoundTo: d.ID, ID: d.ID, Carries: rec.Alias}, true
}

// RecordMismatch reports whether the alias rec carries is bound to rec,
// as verify --all and the catalog listing ask of every record: nil when
// it is, when rec carries none, and when its binding does not decode
// (Damaged reports that). A record deleted meanwhile is no mismatch.
func RecordMismatch(ctx context.Context, repo Repository, rec Record) (*AliasMismatch, error) {
	if rec.Alias == "" {
		return nil, nil
	}
	id, err := repo.ResolveAlias(ctx, rec.Alias)
	var d *DanglingAlias
	switch {
	case err == nil:
	case errors.As(err, &d):
		id = d.ID
	case errors.Is(err, ErrIntegrity):
		return nil, nil
	case errors.Is(err, ErrNotFound):
		id = ""
	default:
		return nil, fmt.Errorf("check alias %s of snapshot %s: %w", rec.Alias, rec.ID, err)
	}
	if id == rec.ID {
		return nil, nil
	}
	// The binding may have moved on because rec was deleted since it was
	// read (a delete removes the record first), or rec may have become
	// unreadable (Damaged reports that).
	switch _, err := repo.Get(ctx, rec.ID); {
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrIntegrity):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("check alias %s of snapshot %s: %w", rec.Alias, rec.ID, err)
	}
	return &AliasMismatch{Alias: rec.Alias, BoundTo: id, ID: rec.ID, Carries: rec.Alias}, nil
}
