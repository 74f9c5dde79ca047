package posixfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"warmstart/internal/repository"
)

// Sweep moves damaged records and aliases to the quarantine
// (quarantine.go) and reclaims what crashed writers left behind: temporary files, alias
// files naming snapshots that have no record, directories of snapshots that
// were never published (or whose delete stopped half way), and lock files
// nobody holds. It only ever tries locks (LOCK_NB) and skips anything whose
// lock is held, so it never waits for, or disturbs, a live writer in any
// process. Open runs it; a long-running daemon may run it now and then.
func (r *Repo) Sweep(ctx context.Context) error {
	if err := r.writable(); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"records", r.sweepRecords}, {"damaged", r.sweepDamaged}, {"aliases", r.sweepAliases},
		{"snapshots", r.sweepSnapshots}, {"dependents", r.sweepDependents}, {"lock files", r.sweepLockFiles},
	}
	// Every step runs whatever the others left: the sweep is housekeeping,
	// and one entry it cannot handle (an undeletable leftover) must not
	// keep it from the rest. Open reports what is left as a warning and
	// goes on (Options.Warn).
	var errs []error
	for _, step := range steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("sweep: %w", err)
		}
		if err := step.run(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", step.name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sweep left entries it could not handle: %w", err)
	}
	return nil
}

// underTryLock runs fn under the lock at path if the lock is free; a held
// lock means a live owner, and the thing is skipped.
func underTryLock(path string, fn func() error) error {
	lk, busy, err := tryLock(path, lockExclusive)
	if err != nil || busy {
		return err
	}
	defer lk.release()
	return fn()
}

func removeIfPresent(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// sweepRecords removes temporary record files whose writer is gone: record
// files are written under the record lock, so a free lock means a dead
// writer.
func (r *Repo) sweepRecords(context.Context) error {
	dir := r.paths.recordsDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		target, ok := tempTarget(e.Name())
		if !ok {
			continue
		}
		id, ok := idFromRecordFileName(target)
		if !ok {
			continue
		}
		tmp := filepath.Join(dir, e.Name())
		errs = append(errs, underTryLock(r.paths.recordLockPath(id), func() error { return removeIfPresent(tmp) }))
	}
	return errors.Join(errs...)
}

// sweepAliases removes temporary alias files and aliases naming a snapshot
// without a record (in place or quarantined), each under its free alias lock: a binder holds that
// lock from binding until its record is written.
func (r *Repo) sweepAliases(context.Context) error {
	dir := r.paths.aliasesDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if target, ok := tempTarget(name); ok {
			if repository.ValidateAlias(target) == nil {
				tmp := filepath.Join(dir, name)
				errs = append(errs, underTryLock(r.paths.aliasLockPath(target), func() error { return removeIfPresent(tmp) }))
			}
			continue
		}
		if repository.ValidateAlias(name) != nil {
			continue
		}
		alias := name
		errs = append(errs, underTryLock(r.paths.aliasLockPath(alias), func() error {
			holder, err := r.readAlias(alias)
			if errors.Is(err, repository.ErrIntegrity) {
				return nil // a damaged binding is quarantined, never removed
			}
			if err != nil || holder == "" {
				return err
			}
			if exists, err := r.recordExists(holder); err != nil || exists {
				return err
			}
			removed, err := removeDurable(dir, alias)
			if removed {
				r.noteSwept(alias, holder)
			}
			return err
		}))
	}
	return errors.Join(errs...)
}

// sweepSnapshots reclaims directories of snapshots without a record and no
// live lease, and temporary files inside published snapshots whose record
// lock is free (attach writes under it; publish has finished once the
// record exists).
func (r *Repo) sweepSnapshots(context.Context) error {
	entries, err := os.ReadDir(r.paths.snapshotsDir())
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		id := e.Name()
		if repository.ValidateID(id) != nil || !e.IsDir() {
			continue
		}
		errs = append(errs, underTryLock(r.paths.recordLockPath(id), func() error {
			exists, err := r.recordExists(id)
			if err != nil {
				return err
			}
			if !exists {
				return r.reclaimUnpublished(id)
			}
			return errors.Join(r.removeTempFiles(r.paths.snapshotDir(id)), r.removeStaleRefinements(id))
		}))
	}
	return errors.Join(errs...)
}

func (r *Repo) removeTempFiles(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if _, ok := tempTarget(e.Name()); ok {
			errs = append(errs, removeIfPresent(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// removeStaleRefinements removes the refinement files id's record does
// not name: left by an attach that crashed before its record, or whose
// removal of the one it replaced failed.
func (r *Repo) removeStaleRefinements(id string) error {
	rec, err := r.readRecord(id)
	if err != nil {
		// A damaged record is quarantined elsewhere; its files stay.
		return nil
	}
	dir := r.paths.snapshotDir(id)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if repository.IsRefinementFile(name) && (rec.Refinement == nil || name != repository.RefinementFileName(rec.Refinement.SHA256)) {
			_, err := removeDurable(dir, name)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sweepLockFiles removes lock files nobody holds; taking one exclusively and
// releasing it unlinks it (see lock.go).
func (r *Repo) sweepLockFiles(context.Context) error {
	var errs []error
	for _, dir := range []string{r.paths.locksDir(), r.paths.leasesDir()} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			if !ours(dir == r.paths.leasesDir(), e.Name()) {
				continue
			}
			errs = append(errs, underTryLock(filepath.Join(dir, e.Name()), func() error { return nil }))
		}
	}
	return errors.Join(errs...)
}

// ours reports whether name is a lock file this package creates.
func ours(lease bool, name string) bool {
	if lease {
		id, ok := strings.CutSuffix(name, lockSuffix)
		return ok && repository.ValidateID(id) == nil
	}
	prefix, target, ok := lockTarget(name)
	switch {
	case !ok:
		return false
	case prefix == recordLockPrefix:
		return repository.ValidateID(target) == nil
	default:
		return repository.ValidateAlias(target) == nil
	}
}

// noteSwept remembers that a sweep released alias, which named the
// missing snapshot id, so that a delete of the alias in this process says
// what became of it (TakeSweptAlias).
func (r *Repo) noteSwept(alias, id string) {
	r.sweptMu.Lock()
	defer r.sweptMu.Unlock()
	if r.swept == nil {
		r.swept = map[string]string{}
	}
	r.swept[alias] = id
}

// TakeSweptAlias implements repository.SweptAliases: the sweep of a
// writable open releases dangling bindings before `snapshot delete ALIAS`
// can look at one, and the delete reports the release as its own.
func (r *Repo) TakeSweptAlias(alias string) (string, bool) {
	r.sweptMu.Lock()
	defer r.sweptMu.Unlock()
	id, ok := r.swept[alias]
	delete(r.swept, alias)
	return id, ok
}
