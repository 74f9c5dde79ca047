package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/chunkmap"
	"warmstart/internal/repository"
)

// Garbage collection of chunk objects: mark and sweep.
//
// Chunks are shared, so Delete cannot remove them; CollectGarbage does,
// run now and then on one node (it is safe on several). It lists the chunk
// objects first, then marks every chunk named by a chunk map still in the
// bucket (published snapshots, and publishes that stored theirs and are in
// progress or dead and not yet swept), by a journal (publishes in
// progress, or dead and not yet swept: journal.go), or by a deletion
// tombstone younger than ChunkGrace. It removes the unmarked chunks that
// are older than ChunkGrace, and those a list of what a publish that never
// finished relied on names (gc/abandoned/, leftovers.go) and nobody wrote
// since that list was written; the lists then go. Why each is safe:
//
//   - A restore in progress anywhere of a snapshot deleted meanwhile: Delete
//     copies the chunk map to gc/deleted/<id>.chunks before it removes
//     anything, and that tombstone keeps the chunks for ChunkGrace (a
//     restore reads its startup set in seconds; a device serving demand
//     misses for longer than ChunkGrace after the delete may then fail,
//     with an error, never wrong bytes).
//   - The publish that listed chunks as abandoned never writes its record:
//     it failed, or a sweep revoked its lease (leftovers.go).
//   - A publish racing the collection: it names every chunk in its journal
//     before it looks for it or uploads it, so a collection that read the
//     journal keeps the chunk however old it is. A collection that read
//     the journals before the publish named a chunk may still remove it
//     (listed as abandoned, or older than ChunkGrace; a publish uploads
//     again a chunk it finds older than ChunkGrace/2, so the latter is
//     rare), and a re-upload may land between the collector's last check
//     of a chunk's age and its DELETE (the store has no conditional
//     DELETE). The publish itself catches both: once its chunk map is
//     stored, so that collections starting from then on keep its chunks,
//     it waits for every collection that may have started before (their
//     markers, collecting.go), then checks every chunk is there and
//     uploads again any that went, before its record.

const tombstonesDir = "gc/deleted/"

func (k keys) tombstonesPrefix() string   { return k.prefix + tombstonesDir }
func (k keys) tombstone(id string) string { return k.prefix + tombstonesDir + id + ".chunks" }

// layerTombstone keeps the chunks of a layer a flatten retired.
func (k keys) layerTombstone(id, name string) string {
	return k.prefix + tombstonesDir + id + "-" + strings.TrimPrefix(name, "layer-") + ".chunks"
}

// GCStats say what a collection did.
type GCStats struct {
	// Chunks is the chunk objects listed, Live those a chunk map or a
	// young tombstone names.
	Chunks, Live int
	// Removed chunks and their bytes; Young unmarked chunks kept for
	// their grace, Publishing those kept because the journal of a publish
	// not yet finished names them.
	Removed, Young, Publishing int
	RemovedBytes               int64
	// Abandoned is how many of the removed chunks went before their grace
	// because only publishes that never finished had relied on them;
	// AbandonedLists the lists of such chunks removed once done with.
	Abandoned, AbandonedLists int
	// Tombstones removed because their grace had passed.
	Tombstones int
	// Markers is how many dependents markers of children that never
	// published were removed (sweepStaleMarkers), RetiredLayers how many
	// layers a flatten had left to a dependent, or not finished retiring,
	// were retired once nothing named them (reclaimRetiredLayers).
	Markers, RetiredLayers int
	// Stopped says the collection stopped removing chunks when it had run
	// for half of CollectorTTL; the next one goes on.
	Stopped bool
	// Failed are the snapshots the collection could not read or clean up
	// and went on past, keeping what they have (failures.go);
	// CollectGarbage then returns them in an IncompleteError too.
	Failed []SnapshotError
}

// CollectGarbage removes the chunk objects no snapshot needs any more.
func (r *Repo) CollectGarbage(ctx context.Context) (GCStats, error) {
	var st GCStats
	if err := r.writable(); err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	// Before the collection's marker: its time bound is the sweep's.
	var fail failures
	err := r.reclaimUnnamed(ctx, &st, &fail)
	st.Failed = fail.list
	if err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	end, err := r.beginCollection(ctx)
	if err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	defer end()
	began := time.Now()
	if err := r.removeDeadMarkers(ctx); err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	candidates, err := r.list(ctx, r.keys.chunksPrefix())
	if err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	st.Chunks = len(candidates)
	mk, err := r.markChunks(ctx)
	if err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	if err := r.sweepChunks(ctx, candidates, mk, began, &st); err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	if err := r.removeDone(ctx, mk, began, &st); err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	if err := fail.err(); err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	return st, nil
}

// reclaimUnnamed removes the dependents markers of children that never
// published, then retires the layers no record or dependent names: their
// chunk maps go to tombstones, so the collection that follows keeps their
// chunks for the chunk grace and a later one removes them.
//
// A snapshot it cannot read or clean up is one of fail's, and keeps
// what it has.
func (r *Repo) reclaimUnnamed(ctx context.Context, st *GCStats, fail *failures) error {
	var err error
	if st.Markers, err = r.sweepStaleMarkers(ctx, fail); err != nil {
		return err
	}
	arts, err := r.list(ctx, r.keys.prefix+artifactsDir)
	if err != nil {
		return err
	}
	st.RetiredLayers, err = r.reclaimRetiredLayers(ctx, arts, fail)
	return err
}

// marks are what a collection found naming chunks, by chunk object key.
type marks struct {
	// live are named by chunk maps and young tombstones, publishing by
	// journals.
	live, publishing map[string]bool
	// abandoned are named by lists of chunks that publishes which never
	// finished relied on, each with when the latest such list was written.
	abandoned map[string]time.Time
	// oldTombs are the tombstones whose grace has passed, lists the
	// abandoned lists read, each with when it was written.
	oldTombs []string
	lists    []minio.ObjectInfo
}

// sweepChunks removes the unmarked candidates older than the grace or
// left by publishes that never finished, until the collection has run for
// half of CollectorTTL: past that a publish may stop waiting for its
// marker (collecting.go), and the next collection takes up the rest.
func (r *Repo) sweepChunks(ctx context.Context, candidates []minio.ObjectInfo, mk marks, began time.Time, st *GCStats) error {
	for _, o := range candidates {
		if time.Since(began) > r.collectorTTL/2 {
			st.Stopped = true
			return nil
		}
		switch {
		case mk.live[o.Key]:
			st.Live++
		case mk.publishing[o.Key]:
			st.Publishing++
		case !r.unneeded(ctx, o, mk.abandoned[o.Key]):
			st.Young++
		default:
			if r.beforeRemoveChunk != nil {
				r.beforeRemoveChunk(o.Key)
			}
			if err := r.remove(ctx, o.Key); err != nil {
				return err
			}
			st.Removed++
			st.RemovedBytes += o.Size
			if time.Since(o.LastModified) <= r.chunkGrace {
				st.Abandoned++
			}
		}
	}
	return nil
}

// unneeded reports whether the chunk object o, which nothing marks, may
// go: it was written more than the grace ago, or no later than
// abandonedAt, when the latest list of a publish that never finished
// naming it was written (zero for none; a chunk written since is another
// publisher's; within the same second, which is all Last-Modified says,
// it counts as the publish's). It asks the store again, so a write since
// the listing counts.
func (r *Repo) unneeded(ctx context.Context, o minio.ObjectInfo, abandonedAt time.Time) bool {
	gone := func(written time.Time) bool {
		return time.Since(written) > r.chunkGrace || (!abandonedAt.IsZero() && !written.After(abandonedAt))
	}
	if !gone(o.LastModified) {
		return false
	}
	info, err := r.core.StatObject(ctx, r.bucket, o.Key, minio.StatObjectOptions{})
	return err == nil && gone(info.LastModified)
}

// removeDone removes the tombstones whose grace has passed and, after a
// collection that went through every chunk, the abandoned lists written
// long enough before it began (LeaseTTL, which absorbs the skew between
// this clock and the store's) that every chunk their publish uploaded was
// among those it listed: a later list waits for the next collection.
func (r *Repo) removeDone(ctx context.Context, mk marks, began time.Time, st *GCStats) error {
	for _, o := range mk.lists {
		if st.Stopped || !o.LastModified.Before(began.Add(-r.leaseTTL)) {
			continue
		}
		if err := r.remove(ctx, o.Key); err != nil {
			return err
		}
		st.AbandonedLists++
	}
	for _, key := range mk.oldTombs {
		if err := r.remove(ctx, key); err != nil {
			return err
		}
		st.Tombstones++
	}
	return nil
}

// markChunks returns the marks of every chunk map, journal and abandoned
// list in the bucket, and of every young tombstone. The tombstones are
// listed only after every map was read: a delete writes its tombstone
// before it removes the map, so a map that vanished while it was being
// read has its tombstone in that later listing. The abandoned lists are
// listed last for the same reason: a sweep writes one before it removes
// the journal it copies.
func (r *Repo) markChunks(ctx context.Context) (marks, error) {
	mk := marks{live: map[string]bool{}, publishing: map[string]bool{}, abandoned: map[string]time.Time{}}
	if err := r.markArtifacts(ctx, mk); err != nil {
		return marks{}, err
	}
	tombs, err := r.list(ctx, r.keys.tombstonesPrefix())
	if err != nil {
		return marks{}, err
	}
	for _, o := range tombs {
		if time.Since(o.LastModified) > r.chunkGrace {
			mk.oldTombs = append(mk.oldTombs, o.Key)
			continue
		}
		if err := r.markList(ctx, o.Key, mk.live); err != nil {
			return marks{}, err
		}
	}
	if mk.lists, err = r.list(ctx, r.keys.abandonedPrefix()); err != nil {
		return marks{}, err
	}
	for _, o := range mk.lists {
		named := map[string]bool{}
		// A list that does not decode removes nothing early: its chunks
		// wait for their grace.
		if err := r.markList(ctx, o.Key, named); err != nil && !errors.Is(err, repository.ErrIntegrity) {
			return marks{}, err
		}
		for key := range named {
			if o.LastModified.After(mk.abandoned[key]) {
				mk.abandoned[key] = o.LastModified
			}
		}
	}
	return mk, nil
}

// markArtifacts marks the chunks every chunk map (live) and journal
// (publishing) under artifacts/ names.
func (r *Repo) markArtifacts(ctx context.Context, mk marks) error {
	arts, err := r.list(ctx, r.keys.prefix+artifactsDir)
	if err != nil {
		return err
	}
	for _, o := range arts {
		into := mk.live
		switch {
		case strings.HasSuffix(o.Key, chunkMapSuffix):
			// memory.chunks and every layer's layer-<h>.chunks
		case strings.HasSuffix(o.Key, "/"+journalName):
			into = mk.publishing
		default:
			continue
		}
		if err := r.markList(ctx, o.Key, into); err != nil {
			return err
		}
	}
	return nil
}

// markList marks in into the chunks the map or digest list at key names.
// One that vanished meanwhile (a delete, whose tombstone markChunks lists
// afterwards) marks nothing; one that does not decode fails with
// ErrIntegrity, since its chunks cannot be told apart.
func (r *Repo) markList(ctx context.Context, key string, into map[string]bool) error {
	body, _, _, err := r.core.GetObject(ctx, r.bucket, key, minio.GetObjectOptions{})
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return ctxErr(ctx, fmt.Errorf("get %s: %w", key, err))
	}
	defer body.Close()
	data, err := io.ReadAll(io.LimitReader(body, 64<<20))
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return ctxErr(ctx, fmt.Errorf("get %s: %w", key, err))
	}
	ds, err := chunkmap.Referenced(data)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", repository.ErrIntegrity, key, err)
	}
	for _, d := range ds {
		into[r.keys.chunk(d)] = true
	}
	return nil
}

// writeTombstone keeps the chunks of snapshot id for ChunkGrace after its
// delete: a server-side copy of its chunk map under gc/deleted/.
//
// For a paused child the map is its own layer's (its ancestors' chunks
// stay with their owners, which cannot be deleted under it).
func (r *Repo) writeTombstone(ctx context.Context, rec repository.Record) error {
	id, name := rec.ID, chunkMapName
	if ls := rec.MemoryLayers; len(ls) > 0 && ls[len(ls)-1].Snapshot == id {
		name = layerChunkMapName(ls[len(ls)-1].Name)
	}
	// Without a chunk map there is nothing to keep.
	if _, err := r.copyObject(ctx, r.keys.artifact(id, name), r.keys.tombstone(id)); err != nil {
		return fmt.Errorf("tombstone %s: %w", id, err)
	}
	return nil
}

// copyObject copies the object src to dst in the store; copied is false
// when there is no src.
func (r *Repo) copyObject(ctx context.Context, src, dst string) (copied bool, err error) {
	_, err = r.core.Client.CopyObject(ctx,
		minio.CopyDestOptions{Bucket: r.bucket, Object: dst},
		minio.CopySrcOptions{Bucket: r.bucket, Object: src})
	switch {
	case err == nil:
		return true, nil
	case isNotFound(err):
		return false, nil
	}
	return false, ctxErr(ctx, fmt.Errorf("copy %s to %s: %w", src, dst, err))
}
