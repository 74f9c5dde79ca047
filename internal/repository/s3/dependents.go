package s3

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"warmstart/internal/repository"
)

// Dependents markers in the bucket: catalog/dependents/<owner>/<child>.json,
// one per owner of a child's layers. A marker is live while the child's
// record (or its quarantined one) names a layer of the owner, in progress
// while the child has no record and a lease on it is held, stale
// otherwise.
//
// There are no locks across nodes, so each side writes, then reads the
// other's write. A publish PUTs its marker, then GETs the owner's record:
// gone, quarantined or marked deleting (Record.DeletingSince within
// DeleteGrace) fails the publish, which removes its marker. A delete
// marks the record deleting (If-Match), then lists the markers: a live or
// in-progress one clears the mark and refuses. With the store's
// read-after-write consistency one of them always sees the other, so no
// child is committed over a removed owner.

// DeleteGrace is how long a deleting mark holds off publishes: a delete
// that crashed after marking stops refusing them once it has passed, and
// a delete that took longer than half of it between marking and removing
// gives up.
const DeleteGrace = 10 * time.Minute

const dependentsDir = "catalog/dependents/"

func (k keys) dependentsOf(owner string) string { return k.prefix + dependentsDir + owner + "/" }
func (k keys) dependent(owner, child string) string {
	return k.dependentsOf(owner) + child + jsonSuffix
}

// register writes id's marker at every owner and then checks the owner is
// there to depend on.
func (r *Repo) register(ctx context.Context, id string, owners []string, inherited []repository.LayerDescriptor) error {
	for _, owner := range owners {
		if _, err := r.putSmall(ctx, r.keys.dependent(owner, id), []byte("{}\n"), putCondition{}); err != nil {
			return err
		}
		if r.afterMarker != nil {
			r.afterMarker(owner)
		}
		rec, _, err := r.getRecord(ctx, owner)
		if err != nil {
			return fmt.Errorf("layer owner %s (an ancestor whose memory the child reads): %w", owner, err)
		}
		if t := rec.DeletingSince; t != nil && time.Since(*t) < DeleteGrace {
			return fmt.Errorf("%w: parent %s is being deleted", repository.ErrNotFound, owner)
		}
		// Read after the marker: a replacement (flatten) before it retired
		// what the child names; one after sees the marker.
		if err := repository.CheckOwnerHolds(rec, inherited); err != nil {
			return err
		}
	}
	return nil
}

// unregister removes id's markers, trying again while the store does not
// answer, as undoPublish does for the artifacts, until the clean-up
// context of ctx ends (publishCleanupContext): a marker left names a
// child that never was, and stays in the parent's dependents until a
// sweep or the parent's delete.
func (r *Repo) unregister(ctx context.Context, id string, owners []string) {
	cctx, cancel := publishCleanupContext(ctx)
	defer cancel()
	left := slices.Clone(owners)
	_ = retryUntilDone(cctx, r.cleanupRetry, func() error {
		for len(left) > 0 {
			if err := r.remove(cctx, r.keys.dependent(left[0], id)); err != nil {
				return err
			}
			left = left[1:]
		}
		return nil
	})
}

// Dependents implements repository.Layers.
func (r *Repo) Dependents(ctx context.Context, id string) (live, inProgress []string, err error) {
	if err := repository.ValidateID(id); err != nil {
		return nil, nil, fmt.Errorf("dependents: %w", err)
	}
	live, inProgress, _, err = r.classifyMarkers(ctx, id)
	if err != nil {
		return nil, nil, fmt.Errorf("dependents of %s: %w", id, err)
	}
	return live, inProgress, nil
}

// classifyMarkers sorts owner's markers.
func (r *Repo) classifyMarkers(ctx context.Context, owner string) (live, inProgress, stale []string, err error) {
	objs, err := r.list(ctx, r.keys.dependentsOf(owner))
	if err != nil {
		return nil, nil, nil, err
	}
	var children []string
	for _, o := range objs {
		if child, ok := r.markerChild(owner, o.Key); ok {
			children = append(children, child)
		}
	}
	return repository.SortMarkers(children, func(child string) (repository.MarkerState, error) { return r.markerState(ctx, owner, child) })
}

// markerState decides one marker: the lease is asked first (see
// repository.MarkerOf).
func (r *Repo) markerState(ctx context.Context, owner, child string) (repository.MarkerState, error) {
	held, err := r.LeaseHeld(ctx, child)
	if err != nil {
		return repository.MarkerStale, err
	}
	rec, _, err := r.getRecord(ctx, child)
	if err != nil && !errors.Is(err, repository.ErrNotFound) && !errors.Is(err, repository.ErrIntegrity) {
		return repository.MarkerStale, err
	}
	quarantined, qerr := r.exists(ctx, r.keys.quarantinedRecord(child))
	if qerr != nil {
		return repository.MarkerStale, qerr
	}
	return repository.MarkerOf(owner, held, rec, err, quarantined), nil
}

// checkNoDependents refuses while id has live or in-progress dependents
// and removes its stale markers.
func (r *Repo) checkNoDependents(ctx context.Context, id string) error {
	live, inProgress, stale, err := r.classifyMarkers(ctx, id)
	if err != nil {
		return fmt.Errorf("check dependents: %w", err)
	}
	if len(live) > 0 || len(inProgress) > 0 {
		return &repository.DependentsError{ID: id, Dependents: live, InProgress: inProgress}
	}
	for _, child := range stale {
		if err := r.remove(ctx, r.keys.dependent(id, child)); err != nil {
			return err
		}
	}
	return nil
}

// errRecordChanged is markDeleting's answer when the record changed since
// it was read (its etag no longer matches).
var errRecordChanged = fmt.Errorf("%w: the record changed while the delete began; try again", repository.ErrStale)

// markDeleting marks rec's record deleting (If-Match etag), then checks
// its dependents: a live one clears the mark again and refuses. It
// returns when it may go on (dependents checked within DeleteGrace/2).
func (r *Repo) markDeleting(ctx context.Context, rec repository.Record, etag string) error {
	now := time.Now().UTC().Round(0)
	marked := rec
	marked.DeletingSince = &now
	newTag, err := r.putRecord(ctx, marked, putCondition{ifMatch: etag})
	if errors.Is(err, errPrecondition) {
		return errRecordChanged
	}
	if err != nil {
		return err
	}
	if r.afterMarkDeleting != nil {
		r.afterMarkDeleting()
	}
	check := r.checkNoDependents(ctx, rec.ID)
	if check == nil && time.Since(now) > DeleteGrace/2 {
		check = fmt.Errorf("checking dependents took %v, over half of the %v deleting grace", time.Since(now), DeleteGrace)
	}
	if check != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		rec.DeletingSince = nil
		_, _ = r.putRecord(cctx, rec, putCondition{ifMatch: newTag})
		return check
	}
	return nil
}

// layersDependentsName returns the names of owner's layers that the
// records of its dependents name; mayName says a marker's child may name
// others it cannot tell: it has no record that decodes (a publish in
// progress or one that may still commit, whose markers sweepStaleMarkers
// removes once it is dead; a quarantined or damaged record).
func (r *Repo) layersDependentsName(ctx context.Context, owner string) (named map[string]bool, mayName bool, err error) {
	objs, err := r.list(ctx, r.keys.dependentsOf(owner))
	if err != nil {
		return nil, false, err
	}
	named = map[string]bool{}
	for _, o := range objs {
		child, ok := r.markerChild(owner, o.Key)
		if !ok {
			continue
		}
		// Without a record (in progress, dead or quarantined) it may
		// name any: a record, once written, only ever drops layers.
		rec, _, err := r.getRecord(ctx, child)
		if err != nil {
			return nil, true, ignoreMissing(err)
		}
		for _, l := range rec.Layers() {
			if l.Snapshot == owner && child != owner {
				named[l.Name] = true
			}
		}
	}
	return named, false, nil
}

// ignoreMissing is err unless it says a record is missing or damaged,
// which the caller has already taken for an answer.
func ignoreMissing(err error) error {
	if errors.Is(err, repository.ErrNotFound) || errors.Is(err, repository.ErrIntegrity) {
		return nil
	}
	return err
}

// markerChild is the child a marker key under owner's dependents names.
func (r *Repo) markerChild(owner, key string) (string, bool) {
	child, ok := strings.CutSuffix(strings.TrimPrefix(key, r.keys.dependentsOf(owner)), jsonSuffix)
	return child, ok && repository.ValidateID(child) == nil
}

// A marker outlives its child's publish when the publisher is killed
// between writing it and its record, or its cleanup never reached the
// store: it names a child that never was, and stays at its owner, which
// a flatten or delete of the owner would find stale and remove. A
// collection removes it sooner (sweepStaleMarkers) once the child's
// publish can never commit:
//
//   - the marker was written more than the abandoned grace ago, by the
//     store's clock (the bound a publisher's silence must reach before
//     the sweep reclaims its artifacts, leftovers.go);
//   - no lease on the child is held here, and no lease object of it is
//     left: a publisher writes its lease object before its markers, and
//     one whose object is gone (ended, revoked and removed by the sweep
//     of an abandoned publish, or expired and removed by sweepLeases) can
//     write no record, since confirmLease rewrites the object only while
//     it is the version last written;
//   - the child has no record in place or quarantined, read after the
//     lease objects were listed (a publish that ended wrote its record
//     before it removed its lease object), or has one that names no layer
//     of the owner (flattened whole; a record never gains an ancestor's
//     layer).

// sweepStaleMarkers removes the markers of children that never published
// and never will (see above) and returns how many. A marker whose child
// it cannot read, or that it cannot remove, stays and is one of fail's.
func (r *Repo) sweepStaleMarkers(ctx context.Context, fail *failures) (int, error) {
	objs, err := r.list(ctx, r.keys.prefix+dependentsDir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, o := range objs {
		owner, _, _ := strings.Cut(strings.TrimPrefix(o.Key, r.keys.prefix+dependentsDir), "/")
		child, ok := r.markerChild(owner, o.Key)
		if !ok || time.Since(o.LastModified) <= r.abandonedGrace {
			continue
		}
		dead, err := r.childNeverNames(ctx, owner, child)
		if err == nil && dead {
			err = r.remove(ctx, o.Key)
			if err == nil {
				n++
			}
		}
		if err != nil {
			if err := fail.add(ctx, child, "its dependents marker at "+owner, err); err != nil {
				return n, fmt.Errorf("marker of %s at %s: %w", child, owner, err)
			}
		}
	}
	return n, nil
}

// childNeverNames reports whether child has not published a record
// naming a layer of owner and never will (see above).
func (r *Repo) childNeverNames(ctx context.Context, owner, child string) (bool, error) {
	if r.leaseLive(child) {
		return false, nil
	}
	leases, err := r.list(ctx, r.keys.leasesOf(child))
	if err != nil || len(leases) > 0 {
		return false, err
	}
	rec, _, err := r.getRecord(ctx, child)
	switch {
	case err == nil:
		return repository.MarkerOf(owner, false, rec, nil, false) == repository.MarkerStale, nil
	case !errors.Is(err, repository.ErrNotFound):
		return false, ignoreMissing(err)
	}
	quarantined, err := r.exists(ctx, r.keys.quarantinedRecord(child))
	return err == nil && !quarantined, err
}
