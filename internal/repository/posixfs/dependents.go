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
func (r *Repo) register(ctx context.Context, id string, owners []string) error {
	for _, owner := range owners {
		if err := r.registerAt(ctx, id, owner); err != nil {
			return err
		}
	}
	return nil
}

func (r *Repo) registerAt(ctx context.Context, id, owner string) error {
	rl, err := acquireLock(ctx, r.paths.recordLockPath(owner), lockExclusive)
	if err != nil {
		return err
	}
	defer rl.release()
	if _, err := r.readRecord(owner); err != nil {
		return fmt.Errorf("layer owner %s (an ancestor whose memory the child reads): %w", owner, err)
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
	for _, e := range entries {
		child := e.Name()
		if repository.ValidateID(child) != nil {
			continue // a temporary file: the sweep's
		}
		state, err := r.markerState(owner, child)
		if err != nil {
			return nil, nil, nil, err
		}
		switch state {
		case markerLive:
			live = append(live, child)
		case markerInProgress:
			inProgress = append(inProgress, child)
		default:
			stale = append(stale, child)
		}
	}
	return live, inProgress, stale, nil
}

type markerState int

const (
	markerStale markerState = iota
	markerLive
	markerInProgress
)

// markerState decides one marker. The child's lease is probed first and,
// when free, held while its record is read: a publish that commits its
// record holds the lease until after, so a record absent under the probe
// stays absent.
func (r *Repo) markerState(owner, child string) (markerState, error) {
	busy, lk, err := r.leaseLive(child)
	if err != nil {
		return markerStale, err
	}
	if lk != nil {
		defer lk.release()
	}
	rec, err := r.readRecord(child)
	switch {
	case err == nil:
		if ownsLayerOf(rec, owner) {
			return markerLive, nil
		}
	case errors.Is(err, repository.ErrIntegrity):
		return markerLive, nil // a record that does not decode may name the owner: keep it
	case !errors.Is(err, repository.ErrNotFound):
		return markerStale, err
	default:
		if quarantined, qerr := exists(r.paths.quarantinedRecordPath(child)); qerr != nil || quarantined {
			return markerLive, qerr
		}
	}
	if busy && err != nil {
		return markerInProgress, nil
	}
	return markerStale, nil
}

// ownsLayerOf reports whether rec names a layer owned by owner.
func ownsLayerOf(rec repository.Record, owner string) bool {
	for _, l := range rec.Layers() {
		if l.Snapshot == owner && rec.ID != owner {
			return true
		}
	}
	return false
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
