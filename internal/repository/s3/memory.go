package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/minio/minio-go/v7"

	"warmstart/internal/chunkcache"
	"warmstart/internal/manifest"
	"warmstart/internal/repository"
)

// memorySource serves a snapshot's memory object through the chunk cache.
// The cache knows the object by the memory file's SHA-256, so snapshots with
// identical memory share cached blocks; every ranged GET carries If-Match
// with the ETag Resolve saw, so a block is never taken from other bytes
// stored under the same key.
type memorySource struct {
	r   *Repo
	obj chunkcache.Object
}

var _ repository.MemorySource = (*memorySource)(nil)

func (r *Repo) memorySource(id, key string, rec repository.Record, etag string) *memorySource {
	fetch := func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
		var o minio.GetObjectOptions
		if err := o.SetRange(off, off+length-1); err != nil {
			return nil, err
		}
		if etag != "" {
			if err := o.SetMatchETag(etag); err != nil {
				return nil, err
			}
		}
		body, info, _, err := r.core.GetObject(ctx, r.bucket, key, o)
		if err != nil {
			if isNotFound(err) || isPreconditionFailed(err) {
				return nil, fmt.Errorf("memory of snapshot %s: %w: %w", id, repository.ErrNotFound, err)
			}
			return nil, ctxErr(ctx, fmt.Errorf("get %s [%d, %d): %w", key, off, off+length, err))
		}
		if info.Size != length {
			body.Close()
			return nil, fmt.Errorf("get %s [%d, %d): the store answered %d bytes", key, off, off+length, info.Size)
		}
		return body, nil
	}
	return &memorySource{r: r, obj: chunkcache.Object{ID: rec.MemorySHA256, Size: rec.MemorySize, Fetch: fetch}}
}

// Ref implements repository.MemorySource.
func (m *memorySource) Ref() string { return "s3-memory:" + m.obj.ID }

// Size implements repository.MemorySource.
func (m *memorySource) Size() int64 { return m.obj.Size }

// OpenMemory implements repository.MemorySource: the reader pins the
// object in the chunk cache until it is closed.
func (m *memorySource) OpenMemory() (repository.MemoryReader, error) {
	rd, err := m.r.cache.Open(m.obj)
	if err != nil {
		return nil, err
	}
	return rd, nil
}

// WarmCache starts fetching the logical ranges of a startup manifest, in
// first-touch order, into the chunk cache, and returns the function that
// stops it (cancelling what has not been fetched) and waits for its GETs
// to end. Memory is one object, so a logical range is a physical one.
func (m *memorySource) WarmCache(ranges []manifest.Range) (stop func(), err error) {
	rs := make([]chunkcache.Range, len(ranges))
	for i, r := range ranges {
		rs[i] = chunkcache.Range{Offset: r.Offset, Length: r.Length}
	}
	w, err := m.r.cache.Warm(m.obj, rs, m.r.warm)
	if err != nil {
		return nil, err
	}
	return w.Stop, nil
}

// idTime is the creation time a UUIDv7 id carries.
func idTime(id string) (time.Time, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return time.Time{}, err
	}
	if u.Version() != 7 {
		return time.Time{}, errors.New("not a UUIDv7")
	}
	sec, nsec := u.Time().UnixTime()
	return time.Unix(sec, nsec), nil
}
