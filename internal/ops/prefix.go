package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"warmstart/internal/repository"
)

// ErrAmbiguousPrefix is the error of an id prefix more than one snapshot's
// id starts with.
var ErrAmbiguousPrefix = errors.New("ambiguous id prefix")

// minIDPrefix is the shortest id prefix taken for an id: shorter ones
// would match most of a catalog.
const minIDPrefix = 4

// ExpandRef turns an id prefix into the id it names, as docker does: ref
// as it is when it names a snapshot (an id or an alias); else the one id
// that starts with ref when ref is at least minIDPrefix hex digits and
// dashes; else ref as it is, for the caller's lookup to report. A prefix
// of several ids is ErrAmbiguousPrefix listing them.
func ExpandRef(ctx context.Context, repo repository.Repository, ref string) (string, error) {
	rec, err := repo.Lookup(ctx, ref)
	if !idPrefix(ref) || rec.ID == ref || (err != nil && !errors.Is(err, repository.ErrNotFound)) {
		return ref, nil
	}
	ids := idsStarting(ctx, repo, ref)
	if err == nil {
		return ref, aliasShadows(ref, rec.ID, ids)
	}
	switch len(ids) {
	case 0:
		return ref, nil
	case 1:
		return ids[0], nil
	}
	// Bad input, as a malformed id is: the daemon answers 400.
	return "", fmt.Errorf("%w: %w %s: it starts %d snapshot ids (%s); give more of the id",
		repository.ErrInvalidRequest, ErrAmbiguousPrefix, ref, len(ids), strings.Join(ids, ", "))
}

// idsStarting lists the ids that start with prefix; none when the
// catalog cannot be listed (the caller's lookup says what is wrong).
func idsStarting(ctx context.Context, repo repository.Repository, prefix string) []string {
	recs, err := repo.List(ctx, repository.Filter{})
	if err != nil {
		return nil
	}
	var ids []string
	for _, r := range recs {
		if strings.HasPrefix(r.ID, strings.ToLower(prefix)) {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// aliasShadows refuses ref, the alias of snapshot id, when it is also the
// start of another snapshot's id: which one the operator means cannot be
// told, and a delete must not guess.
func aliasShadows(ref, id string, ids []string) error {
	others := slices.DeleteFunc(ids, func(s string) bool { return s == id })
	if len(others) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w %s: it is the alias of snapshot %s and the start of snapshot id %s; give the whole id of the one you mean",
		repository.ErrInvalidRequest, ErrAmbiguousPrefix, ref, id, strings.Join(others, ", "))
}

// idPrefix reports whether ref can be the start of a snapshot id.
func idPrefix(ref string) bool {
	if len(ref) < minIDPrefix {
		return false
	}
	for _, c := range strings.ToLower(ref) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c == '-') {
			return false
		}
	}
	return true
}
