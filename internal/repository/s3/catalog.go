package s3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"warmstart/internal/repository"
)

// The catalog: one JSON object per visible snapshot and one per alias.
// Every change is a single conditional PUT, so readers take no locks and
// see one version of an object or the next, never a mix:
//
//   - A record is created with If-None-Match: * (the visibility point) and
//     changed with If-Match on the ETag it was read with, so a change
//     computed from a record that was deleted meanwhile fails (404) instead
//     of recreating it, and one computed from an older version fails (412).
//   - An alias is bound with If-None-Match: *; of two binders the store
//     lets exactly one create the object, the other gets 412 and reports
//     the alias conflict. A binding whose snapshot never became visible is
//     taken over with If-Match on the ETag of that binding, so again one
//     taker wins.

// AliasBindGrace is how long a binding naming a snapshot that has no
// record yet is taken to belong to a publish still in progress (a publisher
// binds the alias just before writing its record). Only after it has
// passed may another publisher take the alias over from a publisher that
// crashed in between. It is compared with the object store's
// Last-Modified, so it also absorbs clock skew between nodes and store.
const AliasBindGrace = 10 * time.Minute

// aliasFormat is the version of the alias object encoding.
const aliasFormat = 1

// aliasBinding is the content of an alias object.
type aliasBinding struct {
	Format int    `json:"format"`
	Alias  string `json:"alias"`
	// ID is the bound snapshot; "" marks a binding released by a failed
	// publish, which the next publisher takes over at once.
	ID string `json:"id"`
}

// getRecord reads and checks the record of id and returns it with its ETag.
func (r *Repo) getRecord(ctx context.Context, id string) (repository.Record, string, error) {
	data, info, found, err := r.getSmall(ctx, r.keys.record(id))
	if err != nil {
		return repository.Record{}, "", fmt.Errorf("read record %s: %w", id, err)
	}
	if !found {
		return repository.Record{}, "", fmt.Errorf("snapshot %s: %w", id, repository.ErrNotFound)
	}
	var rec repository.Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return repository.Record{}, info.ETag, fmt.Errorf("record %s: %w: %v", id, repository.ErrIntegrity, err)
	}
	if err := rec.Validate(); err != nil {
		return repository.Record{}, info.ETag, fmt.Errorf("record %s: %w", id, err)
	}
	if rec.ID != id {
		return repository.Record{}, info.ETag, fmt.Errorf("record %s: %w: it names snapshot %s", id, repository.ErrIntegrity, rec.ID)
	}
	return rec, info.ETag, nil
}

func encodeRecord(rec repository.Record) ([]byte, error) {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode record %s: %w", rec.ID, err)
	}
	return append(data, '\n'), nil
}

// putRecord writes rec under cond and returns the new ETag. It reports
// errPrecondition or errGone when cond does not hold.
func (r *Repo) putRecord(ctx context.Context, rec repository.Record, cond putCondition) (string, error) {
	data, err := encodeRecord(rec)
	if err != nil {
		return "", err
	}
	etag, err := r.putSmall(ctx, r.keys.record(rec.ID), data, cond)
	if err != nil {
		return "", fmt.Errorf("write record %s: %w", rec.ID, err)
	}
	return etag, nil
}

// readAlias returns the binding of alias, with its object's metadata.
// found is false when no alias object exists. An undecodable object is
// reported as ErrIntegrity (with found and etag set).
func (r *Repo) readAlias(ctx context.Context, alias string) (b aliasBinding, etag string, modified time.Time, found bool, err error) {
	data, info, found, err := r.getSmall(ctx, r.keys.alias(alias))
	if errors.Is(err, repository.ErrIntegrity) {
		// Too large to be a binding: damaged, and released on its ETag.
		return aliasBinding{}, info.ETag, info.LastModified, true, fmt.Errorf("alias %s: %w", alias, err)
	}
	if err != nil || !found {
		return aliasBinding{}, "", time.Time{}, false, err
	}
	if err := json.Unmarshal(data, &b); err != nil || b.Alias != alias || (b.ID != "" && repository.ValidateID(b.ID) != nil) {
		return aliasBinding{}, info.ETag, info.LastModified, true, fmt.Errorf("alias %s: %w: undecodable binding", alias, repository.ErrIntegrity)
	}
	return b, info.ETag, info.LastModified, true, nil
}

func encodeBinding(alias, id string) []byte {
	data, _ := json.Marshal(aliasBinding{Format: aliasFormat, Alias: alias, ID: id})
	return append(data, '\n')
}

// holdsAlias reports whether id is a visible snapshot that carries alias.
// A damaged record, in place or quarantined, may carry it: it holds it.
func (r *Repo) holdsAlias(ctx context.Context, id, alias string) (bool, error) {
	rec, _, err := r.getRecord(ctx, id)
	switch {
	case errors.Is(err, repository.ErrIntegrity):
		return true, nil
	case errors.Is(err, repository.ErrNotFound):
		return r.exists(ctx, r.keys.quarantinedRecord(id))
	case err != nil:
		return false, err
	}
	return rec.Alias == alias, nil
}

// checkAliasFree fails with an AliasConflictError if alias is bound to a
// visible snapshot other than id. Publish calls it before uploading, to
// fail fast; the binding itself is decided by bindAlias.
func (r *Repo) checkAliasFree(ctx context.Context, alias, id string) error {
	if taken, err := r.aliasTaken(ctx, alias); err != nil || taken {
		return errors.Join(err, takenErr(alias, taken))
	}
	b, _, _, found, err := r.readAlias(ctx, alias)
	if err != nil {
		return err
	}
	if !found || b.ID == "" || b.ID == id {
		return nil
	}
	held, err := r.holdsAlias(ctx, b.ID, alias)
	if err != nil {
		return err
	}
	if held {
		return &repository.AliasConflictError{Alias: alias, HolderID: b.ID}
	}
	return nil
}

// bindAlias binds alias to id, atomically: of concurrent binders exactly
// one succeeds, the others get an AliasConflictError. There is no retry
// loop: every decision is one conditional PUT. A damaged or quarantined
// binding keeps the alias taken (DamagedAliasError): its holder is
// unknown, and taking it over could give the alias to a second snapshot.
//
// The quarantine is checked again once the binding is made: a Sweep (on
// any node) moves a damaged binding aside by copying it to the quarantine
// and then removing it, so a create that found the place empty may have
// followed that removal, after the check before it. The copy precedes the
// removal, so the check after the create always sees it; the binding is
// then given up again.
func (r *Repo) bindAlias(ctx context.Context, alias, id string) error {
	if err := r.claimAlias(ctx, alias, id); err != nil {
		return err
	}
	q, err := r.exists(ctx, r.keys.quarantinedAlias(alias))
	if err == nil && !q {
		return nil
	}
	if rerr := r.releaseAlias(ctx, alias, id); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return errors.Join(err, takenErr(alias, q))
}

// claimAlias is bindAlias without the check after the create.
func (r *Repo) claimAlias(ctx context.Context, alias, id string) error {
	key := r.keys.alias(alias)
	data := encodeBinding(alias, id)
	if err := r.notQuarantined(ctx, alias); err != nil {
		return err
	}
	_, err := r.putSmall(ctx, key, data, putCondition{ifNoneMatch: true})
	if !errors.Is(err, errPrecondition) {
		if err != nil {
			return fmt.Errorf("bind alias %s: %w", alias, err)
		}
		return nil
	}
	// The alias object exists: find out whose it is.
	b, etag, modified, found, err := r.readAlias(ctx, alias)
	switch {
	case errors.Is(err, repository.ErrIntegrity):
		return repository.DamagedAliasError(alias)
	case err != nil:
		return fmt.Errorf("bind alias %s: %w", alias, err)
	case !found:
		// Deleted since our PUT: one more exclusive create decides.
		if _, err := r.putSmall(ctx, key, data, putCondition{ifNoneMatch: true}); err != nil {
			return r.conflictOr(ctx, alias, fmt.Errorf("bind alias %s: %w", alias, err))
		}
		return nil
	case b.ID == id:
		// Ours: an earlier attempt of this PUT succeeded before its answer
		// was lost and minio-go retried it.
		return nil
	case b.ID != "":
		held, herr := r.holdsAlias(ctx, b.ID, alias)
		if herr != nil {
			return fmt.Errorf("bind alias %s: %w", alias, herr)
		}
		if held || time.Since(modified) < r.aliasGrace {
			return &repository.AliasConflictError{Alias: alias, HolderID: b.ID}
		}
	}
	// Released, or left by a publish that crashed before its record: take
	// it over, if nobody else does first.
	if _, err := r.putSmall(ctx, key, data, putCondition{ifMatch: etag}); err != nil {
		return r.conflictOr(ctx, alias, fmt.Errorf("take over alias %s: %w", alias, err))
	}
	return nil
}

// notQuarantined fails with DamagedAliasError while a binding of alias is
// in the quarantine.
func (r *Repo) notQuarantined(ctx context.Context, alias string) error {
	q, err := r.exists(ctx, r.keys.quarantinedAlias(alias))
	if err != nil || q {
		return errors.Join(err, takenErr(alias, q))
	}
	if r.beforeAliasCreate != nil {
		r.beforeAliasCreate()
	}
	return nil
}

// conflictOr turns a lost conditional PUT on alias into an
// AliasConflictError naming the holder that won, and passes other errors.
func (r *Repo) conflictOr(ctx context.Context, alias string, err error) error {
	if !errors.Is(err, errPrecondition) && !errors.Is(err, errGone) {
		return err
	}
	b, _, _, _, rerr := r.readAlias(ctx, alias)
	if rerr != nil {
		return errors.Join(err, rerr)
	}
	return &repository.AliasConflictError{Alias: alias, HolderID: b.ID}
}

// releaseAlias undoes a binding of alias to id made by a publish that then
// failed. It overwrites the binding with a released one, conditionally on
// its ETag, rather than deleting it: a delete could remove a binding that
// another publisher has just taken over.
func (r *Repo) releaseAlias(ctx context.Context, alias, id string) error {
	b, etag, _, found, err := r.readAlias(ctx, alias)
	if err != nil || !found || b.ID != id {
		return err
	}
	return r.putReleased(ctx, alias, etag)
}

// removeAlias releases the binding of alias if it binds id (Delete). Like
// releaseAlias it overwrites the binding with a released one,
// conditionally on the ETag it read, and never deletes the object: the
// per-id lock holds only in this process, so another node may be deleting
// id too, finish first, and let a publisher bind the alias to its own
// snapshot before this write; an unconditional removal would then delete
// that new binding. A damaged binding (in place or quarantined) is
// released too: the record of id carries the alias, and no other record
// can (binding refuses while the damage is there).
func (r *Repo) removeAlias(ctx context.Context, alias, id string) error {
	b, etag, _, found, err := r.readAlias(ctx, alias)
	damaged := errors.Is(err, repository.ErrIntegrity)
	if err != nil && !damaged {
		return err
	}
	if damaged || (found && b.ID == id) {
		if err := r.putReleased(ctx, alias, etag); err != nil {
			return err
		}
	}
	return r.remove(ctx, r.keys.quarantinedAlias(alias))
}

// putReleased overwrites the binding of alias read with etag by a
// released one. A binding changed or removed since is someone else's now
// and stays.
func (r *Repo) putReleased(ctx context.Context, alias, etag string) error {
	if etag == "" {
		// Without a condition the write could replace anyone's binding.
		return fmt.Errorf("release alias %s: %w: the store gave no ETag for its binding", alias, repository.ErrIntegrity)
	}
	if r.beforeAliasRelease != nil {
		r.beforeAliasRelease(alias)
	}
	_, err := r.putSmall(ctx, r.keys.alias(alias), encodeBinding(alias, ""), putCondition{ifMatch: etag})
	if errors.Is(err, errPrecondition) || errors.Is(err, errGone) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release alias %s: %w", alias, err)
	}
	if r.afterAliasRelease != nil {
		r.afterAliasRelease(alias)
	}
	return nil
}

func takenErr(alias string, taken bool) error {
	if !taken {
		return nil
	}
	return repository.DamagedAliasError(alias)
}

// resolveAlias returns the record alias names, or ErrNotFound.
func (r *Repo) resolveAlias(ctx context.Context, alias string) (repository.Record, error) {
	b, _, _, found, err := r.readAlias(ctx, alias)
	if err != nil {
		return repository.Record{}, err // ErrIntegrity for a damaged binding
	}
	if !found || b.ID == "" {
		// A released binding may sit beside a quarantined one (see bindAlias).
		if q, err := r.exists(ctx, r.keys.quarantinedAlias(alias)); err != nil || q {
			return repository.Record{}, errors.Join(err, fmt.Errorf("alias %s: %w: its binding did not decode and is in quarantine", alias, repository.ErrIntegrity))
		}
	}
	if !found || b.ID == "" {
		return repository.Record{}, fmt.Errorf("alias %s: %w", alias, repository.ErrNotFound)
	}
	// A binding naming a snapshot that is gone, or that does not carry the
	// alias, was left behind by a crashed publish; taken over by the next one.
	// Get, not getRecord: a quarantined record is damaged, not missing.
	rec, err := r.Get(ctx, b.ID)
	switch {
	case errors.Is(err, repository.ErrNotFound):
		return repository.Record{}, repository.DanglingAliasError(alias, b.ID, repository.DanglingMissing)
	case err != nil:
		return repository.Record{}, fmt.Errorf("alias %s: %w", alias, err)
	case rec.Alias != alias:
		return repository.Record{}, repository.DanglingAliasError(alias, b.ID, repository.DanglingNotCarried)
	}
	return rec, nil
}
