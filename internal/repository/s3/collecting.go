package s3

import (
	"context"
	"fmt"
	"time"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/repository"
)

// Collections in progress are visible to publishes, so that a publish
// never writes its record while a collection that missed its chunk map
// may still remove chunks it needs.
//
// The race this closes: a collection reads every chunk map, then checks
// an old chunk's age and removes it. A publish whose map is stored after
// that read, and which re-uploaded and confirmed the chunk between the
// collector's check and its DELETE (the store has no conditional
// DELETE), would write a record naming a chunk that is gone. So a
// collection first writes a marker, gc/collecting/<id>.json, and removes
// it when it is done; a publish, once its chunk map is stored, waits for
// every marker written no later than that map (a collection that may
// not have seen it) to go, and only then confirms its chunks, uploading
// again any that went. A collection whose marker is newer read the maps
// after this one was stored, and keeps its chunks.
//
// A crashed collector's marker would block publishes for ever, so a
// marker older than CollectorTTL counts as gone; a collection stops
// removing chunks once it has run for half of that (the next one goes
// on), and collections remove markers older than twice it.

// CollectorTTL is how long a collection's marker holds publishes back.
const CollectorTTL = 10 * time.Minute

// collectorPoll is how often a waiting publish looks at the markers again.
const collectorPoll = 100 * time.Millisecond

const collectingDir = "gc/collecting/"

func (k keys) collectingPrefix() string   { return k.prefix + collectingDir }
func (k keys) collector(id string) string { return k.prefix + collectingDir + id + ".json" }

// beginCollection writes this collection's marker and returns the
// function that removes it.
func (r *Repo) beginCollection(ctx context.Context) (func(), error) {
	id, err := repository.NewID()
	if err != nil {
		return nil, err
	}
	key := r.keys.collector(id)
	if _, err := r.putSmall(ctx, key, []byte("{}\n"), putCondition{ifNoneMatch: true}); err != nil {
		return nil, fmt.Errorf("mark the collection: %w", err)
	}
	return func() { _ = r.remove(context.WithoutCancel(ctx), key) }, nil
}

// awaitCollections returns once no collection that may have read the chunk
// maps before mapKey was stored is still running.
func (r *Repo) awaitCollections(ctx context.Context, mapKey string) error {
	info, err := r.core.StatObject(ctx, r.bucket, mapKey, minio.StatObjectOptions{})
	if err != nil {
		return ctxErr(ctx, fmt.Errorf("stat %s: %w", mapKey, err))
	}
	// Last-Modified has whole seconds; a marker within a second after the
	// map may have been written before it.
	stored := info.LastModified.Add(time.Second)
	for {
		blocking, err := r.collectionsBefore(ctx, stored)
		if err != nil || !blocking {
			return err
		}
		if r.awaitingCollection != nil {
			r.awaitingCollection()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for a garbage collection to end: %w", ctx.Err())
		case <-time.After(collectorPoll):
		}
	}
}

// collectionsBefore reports whether a live marker written no later than t
// exists.
func (r *Repo) collectionsBefore(ctx context.Context, t time.Time) (bool, error) {
	markers, err := r.list(ctx, r.keys.collectingPrefix())
	if err != nil {
		return false, err
	}
	for _, m := range markers {
		if !m.LastModified.After(t) && time.Since(m.LastModified) < r.collectorTTL {
			return true, nil
		}
	}
	return false, nil
}

// removeDeadMarkers removes markers of collections that crashed long ago.
func (r *Repo) removeDeadMarkers(ctx context.Context) error {
	markers, err := r.list(ctx, r.keys.collectingPrefix())
	if err != nil {
		return err
	}
	for _, m := range markers {
		if time.Since(m.LastModified) > 2*r.collectorTTL {
			if err := r.remove(ctx, m.Key); err != nil {
				return err
			}
		}
	}
	return nil
}
