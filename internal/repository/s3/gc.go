package s3

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/chunkmap"
	"warmstart/internal/repository"
)

// Garbage collection of chunk objects: mark and sweep with a grace period.
//
// Chunks are shared, so Delete cannot remove them; CollectGarbage does,
// run now and then on one node (it is safe on several). It lists the chunk
// objects first, then marks every chunk named by a chunk map still in the
// bucket (published snapshots, publishes in progress or crashed and not
// yet swept) or by a deletion tombstone younger than ChunkGrace, and
// removes the unmarked chunks older than ChunkGrace. Why each is safe:
//
//   - A restore in progress anywhere of a snapshot deleted meanwhile: Delete
//     copies the chunk map to gc/deleted/<id>.chunks before it removes
//     anything, and that tombstone keeps the chunks for ChunkGrace (a
//     restore reads its startup set in seconds; a device serving demand
//     misses for longer than ChunkGrace after the delete may then fail,
//     with an error, never wrong bytes).
//   - A publish racing the collection: chunks it uploads are younger than
//     ChunkGrace, and written after it began, which keeps them while its
//     lease lives however long it takes (leftovers.go); chunks it found in
//     the bucket older than ChunkGrace/2 it uploads again, so they too are
//     young until its record (and chunk map) is written. The collector checks a chunk's age again just
//     before removing it. A re-upload landing between that check and the
//     DELETE (the store has no conditional DELETE) is caught by the
//     publish itself: once its chunk map is stored, so that collections
//     starting from then on keep its chunks, it waits for every
//     collection that may have started before (their markers,
//     collecting.go), then checks every chunk is there and uploads again
//     any that went, before its record.

const tombstonesDir = "gc/deleted/"

func (k keys) tombstonesPrefix() string   { return k.prefix + tombstonesDir }
func (k keys) tombstone(id string) string { return k.prefix + tombstonesDir + id + ".chunks" }

// GCStats say what a collection did.
type GCStats struct {
	// Chunks is the chunk objects listed, Live those marked.
	Chunks, Live int
	// Removed chunks and their bytes; Young unmarked chunks kept for
	// their grace, Publishing those kept because they were written since
	// a publish still in progress began.
	Removed, Young, Publishing int
	RemovedBytes               int64
	// Tombstones removed because their grace had passed.
	Tombstones int
	// Stopped says the collection stopped removing chunks when it had run
	// for half of CollectorTTL; the next one goes on.
	Stopped bool
}

// CollectGarbage removes the chunk objects no snapshot needs any more.
func (r *Repo) CollectGarbage(ctx context.Context) (GCStats, error) {
	var st GCStats
	if err := r.writable(); err != nil {
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
	live, oldTombs, err := r.markChunks(ctx)
	if err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	// Listed after the chunks: a publish that began after this cannot
	// have written any of them.
	publishing, inProgress, err := r.liveCapturesSince(ctx)
	if err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	if err := r.sweepChunks(ctx, candidates, live, sweepWindow{began, publishing, inProgress}, &st); err != nil {
		return st, fmt.Errorf("collect garbage: %w", err)
	}
	for _, key := range oldTombs {
		if err := r.remove(ctx, key); err != nil {
			return st, fmt.Errorf("collect garbage: %w", err)
		}
		st.Tombstones++
	}
	return st, nil
}

// sweepWindow is when a collection began and, if a publish is in
// progress, the time since which chunks may be that publish's.
type sweepWindow struct {
	began, publishing time.Time
	inProgress        bool
}

// sweepChunks removes the unmarked candidates older than the grace and
// than every publish in progress, until the collection has run for half
// of CollectorTTL: past that a publish may stop waiting for its marker
// (collecting.go), and the next collection takes up the rest.
func (r *Repo) sweepChunks(ctx context.Context, candidates []minio.ObjectInfo, live map[string]bool, w sweepWindow, st *GCStats) error {
	for _, o := range candidates {
		if time.Since(w.began) > r.collectorTTL/2 {
			st.Stopped = true
			return nil
		}
		switch {
		case live[o.Key]:
			st.Live++
		case w.inProgress && !o.LastModified.Before(w.publishing):
			st.Publishing++
		case !r.chunkExpired(ctx, o):
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
		}
	}
	return nil
}

// chunkExpired reports whether chunk object o is older than the grace,
// asking the store again so a refresh since the listing counts.
func (r *Repo) chunkExpired(ctx context.Context, o minio.ObjectInfo) bool {
	if time.Since(o.LastModified) <= r.chunkGrace {
		return false
	}
	info, err := r.core.StatObject(ctx, r.bucket, o.Key, minio.StatObjectOptions{})
	return err == nil && time.Since(info.LastModified) > r.chunkGrace
}

// markChunks returns the keys of every chunk a chunk map in the bucket or
// a young tombstone names, and the tombstones whose grace has passed. The
// tombstones are listed only after every map was read: a delete writes its
// tombstone before it removes the map, so a map that vanished while it was
// being read has its tombstone in that later listing.
func (r *Repo) markChunks(ctx context.Context) (map[string]bool, []string, error) {
	live := map[string]bool{}
	arts, err := r.list(ctx, r.keys.prefix+artifactsDir)
	if err != nil {
		return nil, nil, err
	}
	for _, o := range arts {
		if !strings.HasSuffix(o.Key, "/"+chunkMapName) {
			continue
		}
		if err := r.markMap(ctx, o.Key, live); err != nil {
			return nil, nil, err
		}
	}
	tombs, err := r.list(ctx, r.keys.tombstonesPrefix())
	if err != nil {
		return nil, nil, err
	}
	var old []string
	for _, o := range tombs {
		if time.Since(o.LastModified) > r.chunkGrace {
			old = append(old, o.Key)
			continue
		}
		if err := r.markMap(ctx, o.Key, live); err != nil {
			return nil, nil, err
		}
	}
	return live, old, nil
}

// markMap marks the chunks the map at key names. A map that vanished
// meanwhile (a delete, whose tombstone markChunks lists afterwards) marks
// nothing; one that does not decode fails the collection,
// since its chunks cannot be told apart.
func (r *Repo) markMap(ctx context.Context, key string, live map[string]bool) error {
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
	m, err := chunkmap.DecodeAny(data)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", repository.ErrIntegrity, key, err)
	}
	for _, c := range m.Chunks {
		if !c.Zero {
			live[r.keys.chunk(c.Digest)] = true
		}
	}
	return nil
}

// writeTombstone keeps the chunks of snapshot id for ChunkGrace after its
// delete: a server-side copy of its chunk map under gc/deleted/.
func (r *Repo) writeTombstone(ctx context.Context, id string) error {
	src := r.keys.artifact(id, chunkMapName)
	_, err := r.core.Client.CopyObject(ctx,
		minio.CopyDestOptions{Bucket: r.bucket, Object: r.keys.tombstone(id)},
		minio.CopySrcOptions{Bucket: r.bucket, Object: src})
	if err == nil || isNotFound(err) {
		return nil // no chunk map: nothing to keep
	}
	return ctxErr(ctx, fmt.Errorf("tombstone %s: %w", id, err))
}
