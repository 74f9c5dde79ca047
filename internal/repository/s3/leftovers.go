package s3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/repository"
)

// What publishes that never wrote their record leave: the objects under
// artifacts/<id>/ of an id without a record (its VM state, digest table
// and chunk map; the chunk map would otherwise keep its chunks from
// garbage collection). A failed publish removes them itself at once
// (undoPublish), trying again for a while if the store does not answer;
// Sweep reclaims those of publishers that were killed, or whose cleanup
// the store never answered (reclaimAbandoned).
//
// The capture lease tells a publish in progress from an abandoned one: a
// publisher writes its lease object before its first upload and again
// every LeaseTTL/4. The objects of an id are reclaimed (reclaimAbandoned)
// only when
//
//   - the id has no record, in place or quarantined;
//   - no lease on it is held in this process;
//   - the id, and every lease object under leases/<id>/, was last written
//     more than the abandoned grace ago (AbandonedPublishGraceMinutes, at
//     least LeaseTTL);
//   - the reclaim could revoke every such lease object: it overwrites the
//     object with a revoked copy, conditionally on the ETag it listed,
//     and gives up if the publisher wrote the object meanwhile. Exactly
//     one of the two conditional writes wins, and a publisher whose
//     lease was revoked fails every later write of it (rewrite);
//   - the record is still absent after the revocation.
//
// The publisher's side (publish): right before it writes its record it
// writes its lease object again (confirmLease). If that write fails, no
// record is written; if it succeeds, no collector can revoke the lease
// for the next abandoned grace, so a record that lands within half of it
// (the other half absorbs clock skew) cannot follow a reclaim. A record
// that landed later (a publisher stalled for minutes) is taken back if the
// lease turns out revoked.
//
// Chunks are content-addressed and shared, so no lease names them. A
// collection keeps every unreferenced chunk younger than ChunkGrace, and
// also every chunk written since the oldest publish in progress began
// (liveCapturesSince), however long that publish takes; chunks of an
// abandoned publish go once they are older than ChunkGrace and no
// publish in progress began before them.

// AbandonedPublishGraceMinutes is how long, in minutes, the objects of a
// publish that wrote no record stay after the last sign of life of its
// publisher (the last write of its lease object).
const AbandonedPublishGraceMinutes = 10

// AbandonedPublishGrace is AbandonedPublishGraceMinutes as a duration.
const AbandonedPublishGrace = AbandonedPublishGraceMinutes * time.Minute

// commitUnderLease writes the record of a publish whose lease is still
// its own: it writes the lease object first, so that no collector can
// reclaim the snapshot's objects as abandoned before the record lands
// (see above). A record that took longer than half the abandoned grace
// to land is checked against the lease again, and taken back if the lease
// was revoked meanwhile: its objects may be gone.
func (r *Repo) commitUnderLease(ctx context.Context, rec repository.Record) error {
	confirmed := time.Now()
	if err := r.confirmLease(ctx, rec.ID); err != nil {
		return err
	}
	if err := r.commitRecord(ctx, rec); err != nil {
		return err
	}
	if time.Since(confirmed) < r.abandonedGrace/2 {
		return nil
	}
	if err := r.confirmLease(ctx, rec.ID); errors.Is(err, repository.ErrLeaseEnded) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = r.remove(cctx, r.keys.record(rec.ID))
		return err
	}
	return nil
}

// undoPublish removes what a failed publish of id wrote (its artifacts,
// the alias binding it made), trying again while the store does not
// answer, for up to cleanupTimeout, even when ctx was cancelled. It
// returns the publish's error, saying what was left if it could not
// remove it all. Chunks stay: others may have found them in the bucket
// meanwhile, and garbage collection removes those no snapshot uses.
func (r *Repo) undoPublish(ctx context.Context, id, alias string, aliasBound bool, cause error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	err := retryUntilDone(cctx, r.cleanupRetry, func() error {
		if aliasBound {
			if err := r.releaseAlias(cctx, alias, id); err != nil {
				return err
			}
			aliasBound = false
		}
		return r.removeArtifacts(cctx, id)
	})
	if err != nil {
		return fmt.Errorf("%w; what it stored could not be removed (%v): snapshot gc removes it %d minutes after its lease ends",
			cause, err, int(r.abandonedGrace.Minutes()))
	}
	return cause
}

// Retries of a cleanup the store did not answer.
const (
	cleanupFirstRetry = 100 * time.Millisecond
	cleanupMaxRetry   = 5 * time.Second
)

// retryUntilDone runs op until it succeeds or ctx ends, waiting between
// attempts twice as long each time, from cleanupFirstRetry up to
// cleanupMaxRetry; failed, when not nil, is told of each failed attempt.
// It returns op's last error.
func retryUntilDone(ctx context.Context, failed func(error), op func() error) error {
	wait := cleanupFirstRetry
	for {
		err := op()
		if err == nil {
			return nil
		}
		if failed != nil {
			failed(err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, cleanupMaxRetry)
	}
}

// revokedBy is the holder a revoked lease object names.
const revokedBy = "revoked-as-abandoned"

// reclaimAbandoned removes the artifacts of id, which has no record, if
// the publish that wrote them is dead (see above); it leaves them
// otherwise. The caller holds id's lock.
func (r *Repo) reclaimAbandoned(ctx context.Context, id string) error {
	if r.leaseLive(id) || !idOlderThan(id, r.abandonedGrace) {
		return nil
	}
	leases, err := r.list(ctx, r.keys.leasesOf(id))
	if err != nil {
		return err
	}
	for _, o := range leases {
		if time.Since(o.LastModified) <= r.abandonedGrace {
			return nil // its publisher was alive within the grace
		}
	}
	for _, o := range leases {
		revoked, err := r.revokeLease(ctx, id, o)
		if err != nil || !revoked {
			return err
		}
	}
	switch _, _, err := r.getRecord(ctx, id); {
	case err == nil || errors.Is(err, repository.ErrIntegrity):
		return nil // published after all: its publisher takes it back if it must
	case !errors.Is(err, repository.ErrNotFound):
		return err
	}
	if err := r.removeArtifacts(ctx, id); err != nil {
		return err
	}
	for _, o := range leases {
		if err := r.remove(ctx, o.Key); err != nil {
			return err
		}
	}
	return nil
}

// revokeLease overwrites the lease object o of id with a revoked copy if
// it is still the version listed. It reports false when the object was
// written meanwhile: its holder lives.
func (r *Repo) revokeLease(ctx context.Context, id string, o minio.ObjectInfo) (bool, error) {
	data, err := json.Marshal(leaseObject{Format: leaseFormat, ID: id, Holder: revokedBy})
	if err != nil {
		return false, err
	}
	_, err = r.putSmall(ctx, o.Key, data, putCondition{ifMatch: o.ETag})
	switch {
	case err == nil, errors.Is(err, errGone):
		return true, nil
	case errors.Is(err, errPrecondition):
		return false, nil
	}
	return false, fmt.Errorf("revoke lease %s: %w", o.Key, err)
}

// liveCapturesSince returns when the oldest publish in progress began: the
// time in the UUIDv7 id of the oldest id that has a live lease object,
// artifacts and no record, less the lease TTL, which (as for leases)
// absorbs the skew between the publisher's clock and the store's. ok is
// false when no publish is in progress. (A publish stores its VM state
// before any chunk; a published snapshot's lease is a recording's, which
// writes no chunks; a deleted snapshot has no artifacts, whatever leases
// on it are still held.)
func (r *Repo) liveCapturesSince(ctx context.Context) (since time.Time, ok bool, err error) {
	objs, err := r.list(ctx, r.keys.prefix+leasesDir)
	if err != nil {
		return time.Time{}, false, err
	}
	seen := map[string]bool{}
	for _, o := range objs {
		id, live := r.keys.idFromLeaseKey(o.Key), time.Since(o.LastModified) < r.leaseTTL
		if id == "" || !live || seen[id] {
			continue
		}
		seen[id] = true
		began, err := idTime(id)
		if err != nil || (ok && !began.Before(since)) {
			continue
		}
		publishing, err := r.publishing(ctx, id)
		if err != nil {
			return time.Time{}, false, err
		}
		if publishing {
			since, ok = began, true
		}
	}
	return since.Add(-r.leaseTTL), ok, nil
}

// publishing reports whether id has artifacts and no record.
func (r *Repo) publishing(ctx context.Context, id string) (bool, error) {
	switch _, _, err := r.getRecord(ctx, id); {
	case err == nil || errors.Is(err, repository.ErrIntegrity):
		return false, nil
	case !errors.Is(err, repository.ErrNotFound):
		return false, err
	}
	arts, err := r.list(ctx, r.keys.artifactsPrefix(id))
	return len(arts) > 0, err
}
