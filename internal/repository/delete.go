package repository

import (
	"context"
	"errors"
	"fmt"
)

// Deletion is what DeleteRef did with the snapshot a ref named.
type Deletion struct {
	// ID is the snapshot deleted; with Released, the missing snapshot the
	// alias named; with Absent and an id ref, that id.
	ID string `json:"id,omitempty"`
	// Alias is the deleted snapshot's alias, or the alias released.
	Alias string `json:"alias,omitempty"`
	// Released: the ref was an alias naming a snapshot that no longer
	// exists, and its binding was released; no snapshot was there to
	// delete.
	Released bool `json:"released,omitempty"`
	// Absent: nothing visible had that id or alias; nothing was deleted
	// (leftovers of a crashed publish or delete of an id are reclaimed).
	Absent bool `json:"absent,omitempty"`
}

// DeleteRef deletes the snapshot ref (an id or alias) names, as
// `snapshot delete` and DELETE /snapshots/{ref} do. A record that cannot
// be decoded is deleted by its id. An alias whose binding names a snapshot
// that no longer exists (DanglingAlias, DanglingMissing) is released by
// deleting that missing id: Delete releases every binding still naming
// it, under each backend's discipline for alias changes (the alias lock
// on POSIX, the binding's ETag on S3), so a binding re-pointed meanwhile
// stays; DeleteRef then reads the alias again to say which happened.
func DeleteRef(ctx context.Context, repo Repository, ref string) (Deletion, error) {
	rec, err := repo.Lookup(ctx, ref)
	var dangling *DanglingAlias
	switch {
	case errors.As(err, &dangling) && dangling.Why == DanglingMissing:
		return releaseDangling(ctx, repo, dangling)
	case errors.Is(err, ErrNotFound) && RefIsID(ref):
		// Nothing visible, but a crashed publish or delete of this id
		// may have left files that Delete reclaims.
		if err := repo.Delete(ctx, ref); err != nil {
			return Deletion{}, err
		}
		return Deletion{ID: ref, Absent: true}, nil
	case errors.Is(err, ErrNotFound):
		if id, ok := sweptAlias(repo, ref); ok {
			return Deletion{ID: id, Alias: ref, Released: true}, nil
		}
		return Deletion{Alias: ref, Absent: true}, nil
	case errors.Is(err, ErrIntegrity) && RefIsID(ref):
		// A record that cannot be read can still be deleted.
		rec = Record{ID: ref}
	case err != nil:
		return Deletion{}, err
	}
	if err := deleteRecorded(ctx, repo, rec.ID); err != nil {
		return Deletion{}, err
	}
	return Deletion{ID: rec.ID, Alias: rec.Alias}, nil
}

// RecordedDeleter is implemented by a backend that can delete a snapshot
// only while its record is still there, answering ErrNotFound if a
// concurrent delete took it first: DeleteRef uses it once a lookup found
// the record, so that exactly one of concurrent deletes reports the
// deletion.
type RecordedDeleter interface {
	DeleteRecorded(ctx context.Context, id string) error
}

func deleteRecorded(ctx context.Context, repo Repository, id string) error {
	if d, ok := repo.(RecordedDeleter); ok {
		return d.DeleteRecorded(ctx, id)
	}
	return repo.Delete(ctx, id)
}

// releaseDangling deletes the missing snapshot d names and reports
// whether d's binding went with it. A binding still naming the missing
// id was kept by the backend (on S3, one young enough to belong to a
// publish still running: AliasBindGrace); one naming another snapshot
// was re-pointed meanwhile. Either way it stays, and the caller is told
// as an alias conflict naming its holder.
func releaseDangling(ctx context.Context, repo Repository, d *DanglingAlias) (Deletion, error) {
	if err := repo.Delete(ctx, d.ID); err != nil {
		return Deletion{}, err
	}
	holder, err := repo.ResolveAlias(ctx, d.Alias)
	var still *DanglingAlias
	switch {
	case errors.As(err, &still) && still.ID == d.ID:
		return Deletion{}, fmt.Errorf("%v; it was kept: a publish of that snapshot may still be running (try again later): %w",
			d, &AliasConflictError{Alias: d.Alias, HolderID: d.ID})
	case errors.As(err, &still):
		holder = still.ID
	case errors.Is(err, ErrNotFound):
		return Deletion{ID: d.ID, Alias: d.Alias, Released: true}, nil
	case err != nil:
		return Deletion{}, err
	}
	return Deletion{}, fmt.Errorf("alias %s was bound to snapshot %s while its dangling binding was being released; "+
		"nothing deleted: %w", d.Alias, holder, &AliasConflictError{Alias: d.Alias, HolderID: holder})
}

// SweptAliases is implemented by a backend whose writable open sweeps
// dangling alias bindings away (posixfs, under each alias's lock), before
// a delete of such an alias can find it dangling. TakeSweptAlias returns
// the missing id the binding of alias named if this open's sweep released
// it, once.
type SweptAliases interface {
	TakeSweptAlias(alias string) (id string, ok bool)
}

func sweptAlias(repo Repository, alias string) (string, bool) {
	s, ok := repo.(SweptAliases)
	if !ok {
		return "", false
	}
	return s.TakeSweptAlias(alias)
}
