package posixfs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"warmstart/internal/repository"
	"warmstart/internal/untrusted"
)

// maxCatalogFile bounds a record or alias read: real ones are a few KiB.
const maxCatalogFile = 1 << 20

// readCatalogFile reads a record or alias file without following a
// symlink or blocking on a FIFO or device: a catalog entry that is not a
// regular file is damage (ErrIntegrity), like one that does not decode, so
// that it is listed, quarantined and deletable instead of read through
// (a symlink could quote a file outside the store) or failing every
// reader with an I/O error.
func readCatalogFile(path string) ([]byte, error) {
	data, err := untrusted.ReadBounded(path, maxCatalogFile)
	if errors.Is(err, untrusted.ErrNotRegular) || errors.Is(err, untrusted.ErrTooLarge) {
		return nil, fmt.Errorf("%w: %v", repository.ErrIntegrity, err)
	}
	return data, err
}

// The catalog: one JSON file per visible snapshot and one file per bound
// alias. Readers take no locks: every catalog file is replaced by rename,
// so a reader sees the old file or the new one, never a mix.

// readRecord loads and checks the record of id.
func (r *Repo) readRecord(id string) (repository.Record, error) {
	data, err := readCatalogFile(r.paths.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return repository.Record{}, fmt.Errorf("snapshot %s: %w", id, repository.ErrNotFound)
	}
	if err != nil {
		return repository.Record{}, fmt.Errorf("record %s: %w", id, err)
	}
	var rec repository.Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return repository.Record{}, fmt.Errorf("record %s: %w: %v", id, repository.ErrIntegrity, err)
	}
	if err := rec.Validate(); err != nil {
		return repository.Record{}, fmt.Errorf("record %s: %w", id, err)
	}
	if rec.ID != id {
		return repository.Record{}, fmt.Errorf("record %s: %w: it names snapshot %s", id, repository.ErrIntegrity, rec.ID)
	}
	return rec, nil
}

// recordExists reports whether id has a record file, decodable or not,
// in place or quarantined: a quarantined record still holds its alias and
// its artifacts until its id is deleted.
func (r *Repo) recordExists(id string) (bool, error) {
	for _, path := range []string{r.paths.recordPath(id), r.paths.quarantinedRecordPath(id)} {
		if found, err := exists(path); err != nil || found {
			return found, err
		}
	}
	return false, nil
}

// writeRecord durably replaces the record of rec.ID. The caller holds the
// record lock.
func (r *Repo) writeRecord(rec repository.Record, fp faultPoints) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode record %s: %w", rec.ID, err)
	}
	data = append(data, '\n')
	if err := r.writeFileDurable(r.paths.recordsDir(), recordFileName(rec.ID), data, catalogFileMode, fp); err != nil {
		return fmt.Errorf("write record %s: %w", rec.ID, err)
	}
	return nil
}

// removeRecord durably removes the record of id; the snapshot stops being
// visible here. The caller holds the record lock.
func (r *Repo) removeRecord(id string) (bool, error) {
	removed, err := removeDurable(r.paths.recordsDir(), recordFileName(id))
	if err != nil {
		return false, fmt.Errorf("remove record %s: %w", id, err)
	}
	return removed, nil
}

// readAlias returns the id the alias file names, "" if there is none.
func (r *Repo) readAlias(alias string) (string, error) {
	data, err := readCatalogFile(r.paths.aliasPath(alias))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read alias %s: %w", alias, err)
	}
	id := string(bytes.TrimSpace(data))
	if err := repository.ValidateID(id); err != nil {
		return "", fmt.Errorf("alias %s: %w: it holds %q", alias, repository.ErrIntegrity, id)
	}
	return id, nil
}

// bindAlias points alias at id unless a visible snapshot holds it. The
// caller holds the alias lock, which every binder holds from this check
// until its record is written; so an alias naming a snapshot without a
// record, seen under the lock, was left by a crashed publish or delete and
// is taken over.
//
// A binding that cannot be read (damaged or quarantined) keeps the alias
// taken: its holder is unknown, and overwriting it could give the alias to
// a second snapshot.
func (r *Repo) bindAlias(alias, id string) error {
	if taken, err := r.aliasTaken(alias); err != nil || taken {
		return errors.Join(err, takenErr(alias, taken))
	}
	holder, err := r.readAlias(alias)
	if err != nil {
		return err
	}
	if holder != "" && holder != id {
		exists, err := r.recordExists(holder)
		if err != nil {
			return err
		}
		if exists {
			return &repository.AliasConflictError{Alias: alias, HolderID: holder}
		}
	}
	err = r.writeFileDurable(r.paths.aliasesDir(), alias, []byte(id+"\n"), catalogFileMode,
		faultPoints{afterTemp: FaultPublishAfterAliasTemp, afterRename: FaultPublishAfterAlias})
	if err != nil {
		return fmt.Errorf("bind alias %s: %w", alias, err)
	}
	return nil
}

// checkAliasFree reports ErrAliasConflict if alias names a visible snapshot
// other than id. Without the alias lock this is only advice.
func (r *Repo) checkAliasFree(alias, id string) error {
	if taken, err := r.aliasTaken(alias); err == nil && taken {
		return repository.DamagedAliasError(alias)
	}
	holder, err := r.readAlias(alias)
	if err != nil || holder == "" || holder == id {
		return nil
	}
	if exists, err := r.recordExists(holder); err == nil && exists {
		return &repository.AliasConflictError{Alias: alias, HolderID: holder}
	}
	return nil
}

// unbindAlias removes the alias file if it still names id. The caller holds
// the alias lock.
func (r *Repo) unbindAlias(alias, id string) error {
	holder, err := r.readAlias(alias)
	if err != nil && !errors.Is(err, repository.ErrIntegrity) {
		return err
	}
	if holder == id || err != nil {
		if _, err := removeDurable(r.paths.aliasesDir(), alias); err != nil {
			return fmt.Errorf("unbind alias %s: %w", alias, err)
		}
	}
	// The snapshot whose record carries the alias is going: a binding
	// kept in quarantine holds the alias for nobody now (no other record
	// can carry it: binding is refused while the damage is there).
	if _, err := removeDurable(r.paths.quarantinedAliasesDir(), alias); err != nil {
		return fmt.Errorf("unbind alias %s: %w", alias, err)
	}
	return nil
}

func takenErr(alias string, taken bool) error {
	if !taken {
		return nil
	}
	return repository.DamagedAliasError(alias)
}

// Get implements repository.Repository.
func (r *Repo) Get(ctx context.Context, id string) (repository.Record, error) {
	if err := repository.ValidateID(id); err != nil {
		return repository.Record{}, fmt.Errorf("get: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return repository.Record{}, fmt.Errorf("get %s: %w", id, err)
	}
	rec, err := r.readRecord(id)
	if errors.Is(err, repository.ErrNotFound) {
		// A quarantined record is damaged, not gone: say so, so that a
		// lookup by id leads to it (delete it to let it go).
		if q, _ := exists(r.paths.quarantinedRecordPath(id)); q {
			return rec, fmt.Errorf("record %s: %w: it did not decode and is in quarantine", id, repository.ErrIntegrity)
		}
	}
	return rec, err
}

// List implements repository.Repository.
func (r *Repo) List(ctx context.Context, f repository.Filter) ([]repository.Record, error) {
	return repository.ListRecords(ctx, f, r.recordIDs, func(_ context.Context, id string) (repository.Record, error) {
		return r.readRecord(id)
	})
}

// recordIDs lists the ids that have a record entry, of any type: one that
// is not a regular file is damage that List and Damaged must see.
func (r *Repo) recordIDs(context.Context) ([]string, error) {
	entries, err := os.ReadDir(r.paths.recordsDir())
	if err != nil {
		return nil, fmt.Errorf("list records: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if id, ok := idFromRecordFileName(e.Name()); ok {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// ResolveAlias implements repository.Repository.
func (r *Repo) ResolveAlias(ctx context.Context, alias string) (string, error) {
	return repository.ResolveAlias(ctx, alias, r.resolveAlias)
}

// Lookup implements repository.Repository.
func (r *Repo) Lookup(ctx context.Context, ref string) (repository.Record, error) {
	return repository.Lookup(ctx, ref, r.Get, r.resolveAlias)
}

// resolveAlias returns the record a valid alias names, or ErrNotFound.
func (r *Repo) resolveAlias(ctx context.Context, alias string) (repository.Record, error) {
	if err := ctx.Err(); err != nil {
		return repository.Record{}, fmt.Errorf("resolve alias %s: %w", alias, err)
	}
	id, err := r.readAlias(alias)
	if err != nil {
		return repository.Record{}, err
	}
	if id == "" {
		if q, _ := exists(r.paths.quarantinedAliasPath(alias)); q {
			return repository.Record{}, fmt.Errorf("alias %s: %w: its binding did not decode and is in quarantine", alias, repository.ErrIntegrity)
		}
		return repository.Record{}, fmt.Errorf("alias %s: %w", alias, repository.ErrNotFound)
	}
	// A binding naming a snapshot that is gone, or that does not carry the
	// alias, was left behind by a crashed publish or delete; the next
	// publisher of the alias takes it over.
	rec, err := r.Get(ctx, id)
	switch {
	case errors.Is(err, repository.ErrNotFound):
		return repository.Record{}, repository.DanglingAliasError(alias, id, repository.DanglingMissing)
	case err != nil:
		return repository.Record{}, fmt.Errorf("alias %s: %w", alias, err)
	case rec.Alias != alias:
		return repository.Record{}, repository.DanglingAliasError(alias, id, repository.DanglingNotCarried)
	}
	return rec, nil
}
