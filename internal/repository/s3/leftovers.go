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
// artifacts/<id>/ of an id without a record (its VM state, digest tables,
// chunk journal and chunk map; the journal and the map would otherwise
// keep its chunks from garbage collection), and the chunks it uploaded. A
// failed publish removes its objects itself at once (undoPublish), trying
// again for a while if the store does not answer; Sweep reclaims those of
// publishers that were killed, or whose cleanup the store never answered
// (reclaimAbandoned). Either first copies the list of the chunks the
// publish relied on (its journal, journal.go, else its chunk map) to
// gc/abandoned/<id>.chunks, and the next collection removes those of them
// nothing else keeps (gc.go).
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
//     lease was revoked fails every later write of it (rewrite), and
//     every later write of its journal;
//   - the record is still absent after the revocation.
//
// The publisher's side (publish, and a flatten, whose new layer a
// collection retires on the same evidence: layers.go): right before it
// writes its record it writes its lease object again (confirmLease,
// writeUnderLease). If that write fails, no record is written; if it
// succeeds, no collector can revoke the lease for the next abandoned
// grace, so a record that lands within half of it (the other half
// absorbs clock skew) cannot follow a reclaim. A record that landed
// later (a publisher stalled for minutes) is taken back (a flatten's put
// back as it was) if the lease turns out revoked. A reclaimed publish therefore never commits a
// record, and the chunks it listed are nobody's unless another snapshot
// or publish names them: a chunk map, a young tombstone or a journal,
// which a collection honours (gc.go). A publish that named a listed
// chunk in its journal only after a collection read the journals, and
// found it in the bucket before that collection removed it, waits for the
// collection to end before its record and uploads the chunk again
// (collecting.go, confirmChunks).

// AbandonedPublishGraceMinutes is how long, in minutes, the objects of a
// publish that wrote no record stay after the last sign of life of its
// publisher (the last write of its lease object).
const AbandonedPublishGraceMinutes = 10

// AbandonedPublishGrace is AbandonedPublishGraceMinutes as a duration.
const AbandonedPublishGrace = AbandonedPublishGraceMinutes * time.Minute

// commitUnderLease writes the record of a publish whose lease is still
// its own (writeUnderLease), taking it back if it must.
func (r *Repo) commitUnderLease(ctx context.Context, rec repository.Record) error {
	return r.writeUnderLease(ctx, rec.ID, func() error { return r.commitRecord(ctx, rec) },
		func(cctx context.Context) error { return r.remove(cctx, r.keys.record(rec.ID)) })
}

// writeUnderLease writes, by write, a record naming objects stored under
// the lease this process holds on id (a publish's, a flatten's), so that
// no collector reclaims them before the record lands (see above): it
// writes the lease object first, and writes no record if the lease was
// revoked (ErrLeaseEnded). A record that took longer than half the
// abandoned grace to land is checked against the lease again, and taken
// back by takeBack if the lease was revoked meanwhile: its objects may be
// gone. If the take-back fails, the record may stand (errRecordMayStand),
// and nothing it names may go: a collector that revoked the lease after
// the record landed kept its objects.
func (r *Repo) writeUnderLease(ctx context.Context, id string, write func() error, takeBack func(context.Context) error) error {
	confirmed := time.Now()
	if err := r.confirmLease(ctx, id); err != nil {
		return err
	}
	run(r.afterConfirmLease)
	if err := write(); err != nil {
		return err
	}
	if time.Since(confirmed) < r.abandonedGrace/2 {
		return nil
	}
	if err := r.confirmLease(ctx, id); errors.Is(err, repository.ErrLeaseEnded) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if terr := takeBack(cctx); terr != nil {
			return fmt.Errorf("%w; %w (taking it back failed: %w)", err, errRecordMayStand, terr)
		}
		return err
	}
	return nil
}

// undoPublish removes what a failed publish of id wrote (its artifacts,
// the alias binding it made), trying again while the store does not
// answer, until cctx (publishCleanupContext) ends. It returns the
// publish's error, saying what was left if it could not remove it all.
// Chunks stay: others may have found them in the bucket meanwhile; the
// next garbage collection removes those nothing else names
// (abandonArtifacts).
func (r *Repo) undoPublish(cctx context.Context, id, alias string, aliasBound bool, cause error) error {
	err := retryUntilDone(cctx, r.cleanupRetry, func() error {
		if aliasBound {
			if err := r.releaseAlias(cctx, alias, id); err != nil {
				return err
			}
			aliasBound = false
		}
		return r.abandonArtifacts(cctx, id)
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
	if ended, err := r.endLeases(ctx, id, leases); err != nil || !ended {
		return err
	}
	switch _, _, err := r.getRecord(ctx, id); {
	case err == nil || errors.Is(err, repository.ErrIntegrity):
		return nil // published after all: its publisher takes it back if it must
	case !errors.Is(err, repository.ErrNotFound):
		return err
	}
	return r.abandonArtifacts(ctx, id)
}

// endLeases revokes each of id's lease objects leases (revokeLease) and
// then removes it: their holders, silent for the abandoned grace, may
// write under them no more. It reports false, having ended none of them
// for sure, when one was written meanwhile: its holder lives.
func (r *Repo) endLeases(ctx context.Context, id string, leases []minio.ObjectInfo) (bool, error) {
	for _, o := range leases {
		revoked, err := r.revokeLease(ctx, id, o)
		if err != nil || !revoked {
			return false, err
		}
	}
	// Revoked, they would read as fresh lease objects for the TTL, and as
	// signs of life for the grace: gone, they say the lease ended.
	for _, o := range leases {
		if err := r.remove(ctx, o.Key); err != nil {
			return false, err
		}
	}
	return true, nil
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

const abandonedDir = "gc/abandoned/"

func (k keys) abandonedPrefix() string    { return k.prefix + abandonedDir }
func (k keys) abandoned(id string) string { return k.prefix + abandonedDir + id + ".chunks" }

// abandonArtifacts removes the artifacts of id, whose publish will never
// write its record, once the chunks it relied on are listed under
// gc/abandoned/: a copy of its journal, or of its chunk map when it has
// none (a publisher of a build without journals). A publish that relied
// on no chunk yet leaves no list.
func (r *Repo) abandonArtifacts(ctx context.Context, id string) error {
	for _, name := range []string{journalName, chunkMapName} {
		copied, err := r.copyObject(ctx, r.keys.artifact(id, name), r.keys.abandoned(id))
		if err != nil {
			return fmt.Errorf("list the chunks of %s as abandoned: %w", id, err)
		}
		if copied {
			break
		}
	}
	return r.removeArtifacts(ctx, id)
}
