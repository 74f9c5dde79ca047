package posixfs

import (
	"context"
	"errors"
	"fmt"
	"os"

	"warmstart/internal/durable"
	"warmstart/internal/repository"
)

// Dependents markers: catalog/dependents/<owner>/<child>, one empty file
// per owner of a child's layers, written before anything of the child is
// stored. A marker is live while the child's record (in place or
// quarantined) still names a layer of the owner, or while the child has
// no record and its capture lease is held (a publish in progress); any
// other marker is stale, and whoever meets it removes it.
//
// Why no delete loses a child's layers: a publish writes each marker
// under the owner's record lock after reading the owner's record, and a
// delete checks the markers under the same lock before it removes
// anything. Under the lock either the marker is there (the delete is
// refused while it is live) or the owner's record is gone (the publish
// fails). A marker, once written, stays live until the child's lease ends
// without a record.

// register writes id's marker at every owner, each under the owner's
// record lock once the owner's record is read back in place.
func (r *Repo) register(ctx context.Context, id string, owners []string, inherited []repository.LayerDescriptor) error {
	for _, owner := range owners {
		if err := r.registerAt(ctx, id, owner, inherited); err != nil {
			return err
		}
	}
	return nil
}

func (r *Repo) registerAt(ctx context.Context, id, owner string, inherited []repository.LayerDescriptor) error {
	rl, err := acquireLock(ctx, r.paths.recordLockPath(owner), lockExclusive)
	if err != nil {
		return err
	}
	defer rl.release()
	rec, err := r.readRecord(owner)
	if err != nil {
		return fmt.Errorf("layer owner %s (an ancestor whose memory the child reads): %w", owner, err)
	}
	// Under the lock a replacement (flatten) takes too: one before it
	// retired what the child names, one after sees the marker.
	if err := repository.CheckOwnerHolds(rec, inherited); err != nil {
		return err
	}
	for _, dir := range []string{r.paths.dependentsDir(), r.paths.dependentsOf(owner)} {
		if err := mkdirDurable(dir); err != nil {
			return err
		}
	}
	return r.writeFileDurable(r.paths.dependentsOf(owner), id, nil, catalogFileMode, faultPoints{})
}

// unregister removes id's markers (a failed publish, a deleted child);
// best effort: one left behind is stale and goes when met.
func (r *Repo) unregister(id string, owners []string) {
	for _, owner := range owners {
		_, _ = removeDurable(r.paths.dependentsOf(owner), id)
	}
}

// Dependents implements repository.Layers.
func (r *Repo) Dependents(ctx context.Context, id string) (live, inProgress []string, err error) {
	if err := repository.ValidateID(id); err != nil {
		return nil, nil, fmt.Errorf("dependents: %w", err)
	}
	live, inProgress, _, err = r.classifyMarkers(id)
	if err != nil {
		return nil, nil, fmt.Errorf("dependents of %s: %w", id, err)
	}
	return live, inProgress, nil
}

// classifyMarkers sorts owner's markers into live, in progress and
// stale.
func (r *Repo) classifyMarkers(owner string) (live, inProgress, stale []string, err error) {
	entries, err := os.ReadDir(r.paths.dependentsOf(owner))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil, nil
	}
	if err != nil {
		return nil, nil, nil, err
	}
	var children []string
	for _, e := range entries {
		if repository.ValidateID(e.Name()) == nil {
			children = append(children, e.Name()) // not a temporary file: those are the sweep's
		}
	}
	return repository.SortMarkers(children, func(child string) (repository.MarkerState, error) { return r.markerState(owner, child) })
}

// markerState decides one marker. The child's lease is probed first and,
// when free, held while its record is read, so no publish can take it and
// commit meanwhile.
func (r *Repo) markerState(owner, child string) (repository.MarkerState, error) {
	busy, lk, err := r.leaseLive(child)
	if err != nil {
		return repository.MarkerStale, err
	}
	if lk != nil {
		defer lk.release()
	}
	rec, err := r.readRecord(child)
	if err != nil && !errors.Is(err, repository.ErrNotFound) && !errors.Is(err, repository.ErrIntegrity) {
		return repository.MarkerStale, err
	}
	quarantined, qerr := exists(r.paths.quarantinedRecordPath(child))
	if qerr != nil {
		return repository.MarkerStale, qerr
	}
	return repository.MarkerOf(owner, busy, rec, err, quarantined), nil
}

// checkNoDependents refuses to remove id while it has live dependents or
// ones being published, and removes its stale markers. The caller holds
// id's record lock.
func (r *Repo) checkNoDependents(id string) error {
	live, inProgress, stale, err := r.classifyMarkers(id)
	if err != nil {
		return fmt.Errorf("check dependents: %w", err)
	}
	if len(live) > 0 || len(inProgress) > 0 {
		return &repository.DependentsError{ID: id, Dependents: live, InProgress: inProgress}
	}
	for _, child := range stale {
		if _, err := removeDurable(r.paths.dependentsOf(id), child); err != nil {
			return err
		}
	}
	return nil
}

// removeDependentsDir removes the markers directory of a deleted owner
// once it is empty. The caller holds the owner's record lock.
func (r *Repo) removeDependentsDir(id string) {
	if err := os.Remove(r.paths.dependentsOf(id)); err == nil {
		_ = durable.Sync(r.paths.dependentsDir())
	}
}

// sweepDependents removes stale markers, each under its owner's record
// lock (tried, never waited for), and the markers directory of an owner
// with none left and no record.
func (r *Repo) sweepDependents(context.Context) error {
	entries, err := os.ReadDir(r.paths.dependentsDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		owner := e.Name()
		if repository.ValidateID(owner) != nil {
			continue
		}
		errs = append(errs, underTryLock(r.paths.recordLockPath(owner), func() error {
			if err := r.checkNoDependents(owner); err != nil && !errors.Is(err, repository.ErrHasDependents) {
				return err
			}
			if ok, err := r.recordExists(owner); err == nil && !ok {
				r.removeDependentsDir(owner)
			}
			return nil
		}))
	}
	return errors.Join(errs...)
}
