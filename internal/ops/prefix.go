package ops

import (
	"context"
	"errors"
	"fmt"
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
	_, err := repo.Lookup(ctx, ref)
	if !errors.Is(err, repository.ErrNotFound) || !idPrefix(ref) {
		return ref, nil
	}
	recs, err := repo.List(ctx, repository.Filter{})
	if err != nil {
		return ref, nil // the caller's lookup says what is wrong
	}
	var ids []string
	for _, r := range recs {
		if strings.HasPrefix(r.ID, strings.ToLower(ref)) {
			ids = append(ids, r.ID)
		}
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
