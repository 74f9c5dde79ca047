package s3

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/repository"
)

// Damaged catalog objects. A record or alias object that does not decode
// is reported by Damaged and, by Sweep only (a writer), copied to
// catalog/quarantine/{records,aliases}/ under the same name and then
// removed from its place. A quarantined record still counts as holding any
// alias bound to its id, a damaged or quarantined alias keeps its alias
// taken, and Delete of a quarantined record's id removes it and its
// artifacts: nothing is lost until an operator acts.

const (
	quarantinedRecordsDir = repository.QuarantineDir + "records/"
	quarantinedAliasesDir = repository.QuarantineDir + "aliases/"
)

func (k keys) aliasesPrefix() string { return k.prefix + aliasesDir }
func (k keys) quarantinedRecord(id string) string {
	return k.prefix + quarantinedRecordsDir + id + jsonSuffix
}
func (k keys) quarantinedAlias(alias string) string {
	return k.prefix + quarantinedAliasesDir + alias + jsonSuffix
}

// nameUnder returns the valid id or alias a catalog key under dir names.
func (k keys) nameUnder(dir, key string, valid func(string) error) (string, bool) {
	rest, ok := strings.CutPrefix(key, k.prefix+dir)
	if !ok {
		return "", false
	}
	name, ok := strings.CutSuffix(rest, jsonSuffix)
	if !ok || valid(name) != nil {
		return "", false
	}
	return name, true
}

// exists reports whether an object is stored under key.
func (r *Repo) exists(ctx context.Context, key string) (bool, error) {
	_, err := r.core.Client.StatObject(ctx, r.bucket, key, minio.StatObjectOptions{})
	if isNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, ctxErr(ctx, fmt.Errorf("stat %s: %w", key, err))
	}
	return true, nil
}

// Damaged implements repository.Repository.
func (r *Repo) Damaged(ctx context.Context) ([]repository.Damage, error) {
	out, err := r.damaged(ctx, func(_ string, err error) error { return err })
	if err != nil {
		return nil, fmt.Errorf("check catalog: %w", err)
	}
	return out, nil
}

// damaged finds the damaged catalog entries; unread is told of each
// record or alias that could not be read (neither found whole nor
// damaged), and the scan stops with the error it returns, if any.
func (r *Repo) damaged(ctx context.Context, unread func(name string, err error) error) ([]repository.Damage, error) {
	var out []repository.Damage
	for _, scan := range []func(context.Context, func(string, error) error) ([]repository.Damage, error){
		r.damagedRecords, r.damagedAliases, r.quarantined,
	} {
		found, err := scan(ctx, unread)
		if err != nil {
			return nil, err
		}
		out = append(out, found...)
	}
	repository.SortDamage(out)
	return out, nil
}

func (r *Repo) damagedRecords(ctx context.Context, unread func(string, error) error) ([]repository.Damage, error) {
	ids, err := r.recordIDs(ctx)
	if err != nil {
		return nil, err
	}
	var out []repository.Damage
	for _, id := range ids {
		_, _, err := r.getRecord(ctx, id)
		if d, ok := repository.DamageOf(repository.DamageRecord, id, r.keys.record(id), err); ok {
			out = append(out, d)
		} else if err != nil && !errors.Is(err, repository.ErrNotFound) {
			if err := unread(id, err); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

func (r *Repo) damagedAliases(ctx context.Context, unread func(string, error) error) ([]repository.Damage, error) {
	objs, err := r.list(ctx, r.keys.aliasesPrefix())
	if err != nil {
		return nil, err
	}
	var out []repository.Damage
	for _, o := range objs {
		alias, ok := r.keys.nameUnder(aliasesDir, o.Key, repository.ValidateAlias)
		if !ok {
			continue
		}
		_, _, _, _, err := r.readAlias(ctx, alias)
		if d, ok := repository.DamageOf(repository.DamageAlias, alias, o.Key, err); ok {
			out = append(out, d)
		} else if err != nil {
			if err := unread("alias "+alias, err); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

func (r *Repo) quarantined(ctx context.Context, _ func(string, error) error) ([]repository.Damage, error) {
	objs, err := r.list(ctx, r.keys.prefix+repository.QuarantineDir)
	if err != nil {
		return nil, err
	}
	var out []repository.Damage
	for _, o := range objs {
		d := repository.Damage{Quarantined: true, Location: o.Key, Reason: "moved to quarantine: did not decode"}
		if id, ok := r.keys.nameUnder(quarantinedRecordsDir, o.Key, repository.ValidateID); ok {
			d.Kind, d.Name = repository.DamageRecord, id
		} else if alias, ok := r.keys.nameUnder(quarantinedAliasesDir, o.Key, repository.ValidateAlias); ok {
			d.Kind, d.Name = repository.DamageAlias, alias
		} else {
			continue
		}
		out = append(out, d)
	}
	return out, nil
}

// quarantineDamaged moves every damaged record and alias in place to the
// quarantine, rechecking each just before: a copy first, then the removal,
// so a crash between the two leaves the entry in both places, never in
// neither. An entry it could not read or move is one of fail's, and
// stays where it is.
func (r *Repo) quarantineDamaged(ctx context.Context, fail *failures) error {
	found, err := r.damaged(ctx, func(name string, err error) error { return fail.add(ctx, name, "read", err) })
	if err != nil {
		return fmt.Errorf("check catalog: %w", err)
	}
	for _, d := range found {
		if d.Quarantined {
			continue
		}
		if err := r.quarantineOne(ctx, d); err != nil {
			name := d.Name
			if d.Kind == repository.DamageAlias {
				name = "alias " + d.Name
			}
			if err := fail.add(ctx, name, "quarantine", err); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *Repo) quarantineOne(ctx context.Context, d repository.Damage) error {
	from, to := r.keys.alias(d.Name), r.keys.quarantinedAlias(d.Name)
	if d.Kind == repository.DamageRecord {
		unlock := r.locks.lock(d.Name)
		defer unlock()
		if _, _, err := r.getRecord(ctx, d.Name); !errors.Is(err, repository.ErrIntegrity) {
			return nil // repaired or deleted meanwhile
		}
		from, to = r.keys.record(d.Name), r.keys.quarantinedRecord(d.Name)
	} else if _, _, _, _, err := r.readAlias(ctx, d.Name); !errors.Is(err, repository.ErrIntegrity) {
		return nil
	}
	data, _, found, err := r.getSmall(ctx, from)
	if err != nil || !found {
		return err
	}
	if _, err := r.putSmall(ctx, to, data, putCondition{}); err != nil {
		return err
	}
	return r.remove(ctx, from)
}

// aliasTaken reports whether alias is held by a binding that cannot be
// read: a damaged alias object or a quarantined one.
func (r *Repo) aliasTaken(ctx context.Context, alias string) (bool, error) {
	_, _, _, _, err := r.readAlias(ctx, alias)
	if errors.Is(err, repository.ErrIntegrity) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return r.exists(ctx, r.keys.quarantinedAlias(alias))
}

// releaseBindingsOf releases every alias binding naming id (Delete): the
// alias of a record that does not decode is unknown, and a binding a
// crashed publish left naming id would otherwise outlive it. A binding
// naming id can be taken over by a publisher meanwhile (once a healthy
// record does not carry its alias, or id's record is gone), so each is
// released like a failed publish's, conditionally on the ETag it was read
// with (putReleased): one taken over stays its new holder's.
func (r *Repo) releaseBindingsOf(ctx context.Context, id string) error {
	return r.releaseBindingsOlder(ctx, id, 0)
}

// releaseDanglingBindingsOf is releaseBindingsOf for an id without a
// record (Delete of a missing id, as `snapshot delete` of a dangling alias
// asks): a binding younger than AliasBindGrace may be a publish's that has
// not written its record yet, and stays, as claimAlias leaves it.
func (r *Repo) releaseDanglingBindingsOf(ctx context.Context, id string) error {
	return r.releaseBindingsOlder(ctx, id, r.aliasGrace)
}

// releaseBindingsOlder releases the bindings naming id that were written
// at least minAge ago.
func (r *Repo) releaseBindingsOlder(ctx context.Context, id string, minAge time.Duration) error {
	objs, err := r.list(ctx, r.keys.aliasesPrefix())
	if err != nil {
		return err
	}
	for _, o := range objs {
		alias, ok := r.keys.nameUnder(aliasesDir, o.Key, repository.ValidateAlias)
		if !ok {
			continue
		}
		b, etag, modified, found, err := r.readAlias(ctx, alias)
		if err != nil || !found || b.ID != id || time.Since(modified) < minAge {
			continue // another snapshot's, released, damaged (kept), or young
		}
		if err := r.putReleased(ctx, alias, etag); err != nil {
			return err
		}
	}
	return nil
}
