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
// answer, as undoPublish does for the artifacts, for up to
// cleanupTimeout: a marker left names a child that never was, and stays
// in the parent's dependents until a sweep or the parent's delete.
func (r *Repo) unregister(ctx context.Context, id string, owners []string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
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
		child, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, r.keys.dependentsOf(owner)), jsonSuffix)
		if ok && repository.ValidateID(child) == nil {
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
