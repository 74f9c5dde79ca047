package posixfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"warmstart/internal/durable"
	"warmstart/internal/repository"
)

// Damaged catalog entries. A record or alias file that does not decode is
// reported by Damaged and, by a writable open's sweep only, moved to
// catalog/quarantine/{records,aliases}/ under the same name. Nothing here
// deletes: a quarantined record keeps its snapshot's artifacts (the sweep
// counts it as a record) and a quarantined or damaged alias keeps its alias
// taken, until an operator deletes the snapshot or removes the file.

func (p paths) quarantineDir() string { return filepath.Join(p.catalogDir(), quarantineDirName) }
func (p paths) quarantinedRecordsDir() string {
	return filepath.Join(p.quarantineDir(), recordsDirName)
}
func (p paths) quarantinedAliasesDir() string {
	return filepath.Join(p.quarantineDir(), aliasesDirName)
}
func (p paths) quarantinedRecordPath(id string) string {
	return filepath.Join(p.quarantinedRecordsDir(), recordFileName(id))
}
func (p paths) quarantinedAliasPath(alias string) string {
	return filepath.Join(p.quarantinedAliasesDir(), alias)
}

// exists reports whether path has a directory entry.
func exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	return true, nil
}

// Damaged implements repository.Repository.
func (r *Repo) Damaged(ctx context.Context) ([]repository.Damage, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("check catalog: %w", err)
	}
	records, err := r.damagedRecords()
	if err != nil {
		return nil, fmt.Errorf("check catalog: %w", err)
	}
	aliases, err := r.damagedAliases()
	if err != nil {
		return nil, fmt.Errorf("check catalog: %w", err)
	}
	out := append(records, aliases...)
	for _, q := range []struct{ kind, dir string }{
		{repository.DamageRecord, r.paths.quarantinedRecordsDir()},
		{repository.DamageAlias, r.paths.quarantinedAliasesDir()},
	} {
		found, err := quarantined(q.kind, q.dir)
		if err != nil {
			return nil, fmt.Errorf("check catalog: %w", err)
		}
		out = append(out, found...)
	}
	repository.SortDamage(out)
	return out, nil
}

func (r *Repo) damagedRecords() ([]repository.Damage, error) {
	ids, err := r.recordIDs(context.Background())
	if err != nil {
		return nil, err
	}
	var out []repository.Damage
	for _, id := range ids {
		_, err := r.readRecord(id)
		if d, ok := repository.DamageOf(repository.DamageRecord, id, r.paths.recordPath(id), err); ok {
			out = append(out, d)
		}
	}
	return out, nil
}

func (r *Repo) damagedAliases() ([]repository.Damage, error) {
	entries, err := os.ReadDir(r.paths.aliasesDir())
	if err != nil {
		return nil, fmt.Errorf("list aliases: %w", err)
	}
	var out []repository.Damage
	for _, e := range entries {
		alias := e.Name()
		if repository.ValidateAlias(alias) != nil {
			continue // temp files and strays are the sweep's
		}
		_, err := r.readAlias(alias)
		if d, ok := repository.DamageOf(repository.DamageAlias, alias, r.paths.aliasPath(alias), err); ok {
			out = append(out, d)
		}
	}
	return out, nil
}

// quarantined lists the entries moved to dir; a missing dir holds none.
func quarantined(kind, dir string) ([]repository.Damage, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list quarantine: %w", err)
	}
	var out []repository.Damage
	for _, e := range entries {
		name := e.Name()
		if kind == repository.DamageRecord {
			id, ok := idFromRecordFileName(name)
			if !ok {
				continue
			}
			name = id
		} else if repository.ValidateAlias(name) != nil {
			continue
		}
		out = append(out, repository.Damage{Kind: kind, Name: name, Quarantined: true,
			Location: filepath.Join(dir, e.Name()), Reason: "moved to quarantine: did not decode"})
	}
	return out, nil
}

// sweepDamaged moves damaged records and aliases to the quarantine, each
// under its free lock and only if it still does not decode under it.
func (r *Repo) sweepDamaged(ctx context.Context) error {
	found, err := r.Damaged(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range found {
		if d.Quarantined {
			continue
		}
		switch d.Kind {
		case repository.DamageRecord:
			errs = append(errs, underTryLock(r.paths.recordLockPath(d.Name), func() error {
				_, err := r.readRecord(d.Name)
				if !errors.Is(err, repository.ErrIntegrity) {
					return nil
				}
				return moveDurable(r.paths.recordPath(d.Name), r.paths.quarantinedRecordsDir())
			}))
		case repository.DamageAlias:
			errs = append(errs, underTryLock(r.paths.aliasLockPath(d.Name), func() error {
				_, err := r.readAlias(d.Name)
				if !errors.Is(err, repository.ErrIntegrity) {
					return nil
				}
				return moveDurable(r.paths.aliasPath(d.Name), r.paths.quarantinedAliasesDir())
			}))
		}
	}
	return errors.Join(errs...)
}

// moveDurable renames path into dir (same file system, same name),
// creating dir, and syncs both directories.
func moveDurable(path, dir string) error {
	if err := mkdirDurable(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := mkdirDurable(dir); err != nil {
		return err
	}
	if err := os.Rename(path, filepath.Join(dir, filepath.Base(path))); err != nil {
		return fmt.Errorf("quarantine %s: %w", path, err)
	}
	if err := durable.Sync(dir); err != nil {
		return err
	}
	return durable.Sync(filepath.Dir(path))
}

// aliasTaken reports whether alias is held by a binding that cannot be
// read: a damaged alias file or a quarantined one. Binding it then would
// risk a second snapshot carrying the alias.
func (r *Repo) aliasTaken(alias string) (bool, error) {
	if _, err := r.readAlias(alias); errors.Is(err, repository.ErrIntegrity) {
		return true, nil
	}
	return exists(r.paths.quarantinedAliasPath(alias))
}
