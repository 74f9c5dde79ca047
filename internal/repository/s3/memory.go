package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/minio/minio-go/v7"

	"warmstart/internal/chunkcache"
	"warmstart/internal/chunkmap"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
)

// memorySource serves a snapshot's memory through the chunk cache. The
// cache knows the memory by the memory file's SHA-256, so snapshots with
// identical memory share cached blocks whatever their stored format. With
// a startup pack, the startup set is read from the pack (a second cache
// object) and the rest from the memory.
type memorySource struct {
	r    *Repo
	obj  chunkcache.Object
	pack *packSource
	// packSkipped is why this source went without its startup pack:
	// unusable when resolved, or a read of it that failed and was served
	// from the chunks. stream is the pack's stream, whose failure counts
	// too.
	packSkipped firstError
	stream      atomic.Pointer[chunkcache.Warming]
	// chunkBytes is a chunked memory's chunk size (0 for a raw object):
	// the unit a fetch decodes whole.
	chunkBytes int64
}

var _ repository.MemorySource = (*memorySource)(nil)

// memoryOf returns the memory source of rec in the format its record names.
func (r *Repo) memoryOf(ctx context.Context, rec repository.Record) (*memorySource, error) {
	if rec.MemoryFormat == repository.MemoryFormatChunks {
		return r.chunkedMemory(ctx, rec)
	}
	return r.rawMemory(ctx, rec)
}

// chunkedMemory loads the chunk map (checked against the record) into the
// node's file cache and serves the memory from the chunks it names.
func (r *Repo) chunkedMemory(ctx context.Context, rec repository.Record) (*memorySource, error) {
	m, err := r.ChunkMap(ctx, rec)
	if err != nil {
		return nil, err
	}
	obj := chunkcache.Object{ID: rec.MemorySHA256, Size: rec.MemorySize, Fetch: r.chunkedFetch(m)}
	return &memorySource{r: r, obj: obj, chunkBytes: m.ChunkBytes}, nil
}

// ChunkMap is the chunk map of rec's memory (a MemoryFormatChunks
// record), read through the node's file cache and checked against the
// record: which chunk objects the snapshot's memory is made of.
func (r *Repo) ChunkMap(ctx context.Context, rec repository.Record) (chunkmap.Map, error) {
	return r.chunkMapOf(ctx, rec, chunkMapName)
}

// chunkMapOf is ChunkMap of the chunk map object name of rec.ID, which
// rec's MemoryChunks, MemorySize describe (a layer's, when rec stands for
// one layer).
func (r *Repo) chunkMapOf(ctx context.Context, rec repository.Record, name string) (chunkmap.Map, error) {
	d := rec.MemoryChunks
	if d == nil {
		return chunkmap.Map{}, fmt.Errorf("snapshot %s: %w: memory is not stored as chunks", rec.ID, repository.ErrInvalidRequest)
	}
	p, err := r.fetchLocal(ctx, r.keys.artifact(rec.ID, name), d.SHA256, d.Size)
	if errors.Is(err, os.ErrNotExist) {
		return chunkmap.Map{}, r.goneOr(ctx, rec.ID, &repository.IntegrityError{Artifact: name,
			Want: fmt.Sprintf("%d bytes", d.Size), Got: "no object"})
	}
	if err != nil {
		return chunkmap.Map{}, err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return chunkmap.Map{}, fmt.Errorf("read chunk map: %w", err)
	}
	if got := sha256Hex(data); got != d.SHA256 {
		return chunkmap.Map{}, &repository.IntegrityError{Artifact: name, Want: d.SHA256, Got: got}
	}
	m, err := chunkmap.Decode(data, rec.MemorySize)
	if err != nil {
		return chunkmap.Map{}, fmt.Errorf("%w: %w", repository.ErrIntegrity, err)
	}
	return m, nil
}

// goneOr reports ErrNotFound when id's record is gone (deleted while it
// was being resolved), else err.
func (r *Repo) goneOr(ctx context.Context, id string, err error) error {
	if _, _, gerr := r.getRecord(ctx, id); errors.Is(gerr, repository.ErrNotFound) {
		return gerr
	}
	return err
}

// rawMemory serves memory stored as one object (records written before
// memory was chunked): every ranged GET carries If-Match with the ETag
// seen here, so a block is never taken from other bytes under that key.
func (r *Repo) rawMemory(ctx context.Context, rec repository.Record) (*memorySource, error) {
	return r.rawObject(ctx, rec, repository.MemoryFileName)
}

// rawObject serves the object name of rec.ID, of rec.MemorySize bytes
// whose SHA-256 is rec.MemorySHA256, as rawMemory does.
func (r *Repo) rawObject(ctx context.Context, rec repository.Record, name string) (*memorySource, error) {
	id, key := rec.ID, r.keys.artifact(rec.ID, name)
	info, err := r.core.StatObject(ctx, r.bucket, key, minio.StatObjectOptions{})
	if isNotFound(err) {
		return nil, r.goneOr(ctx, id, &repository.IntegrityError{Artifact: name,
			Want: fmt.Sprintf("%d bytes", rec.MemorySize), Got: "no object"})
	}
	if err != nil {
		return nil, ctxErr(ctx, fmt.Errorf("stat %s: %w", key, err))
	}
	if info.Size != rec.MemorySize {
		return nil, &repository.IntegrityError{Artifact: name,
			Want: fmt.Sprintf("%d bytes", rec.MemorySize), Got: fmt.Sprintf("%d bytes", info.Size)}
	}
	fetch := func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
		return r.rangedGet(ctx, key, info.ETag, off, length, "memory of snapshot "+id)
	}
	return &memorySource{r: r, obj: chunkcache.Object{ID: rec.MemorySHA256, Size: rec.MemorySize, Fetch: fetch}}, nil
}

// rangedGet is one GET of [off, off+length) of key, conditional on etag
// when given. A missing object is ErrNotFound; a replaced one (other bytes
// under the published key: the ETag no longer matches) ErrIntegrity, since
// a delete removes objects and never rewrites them.
func (r *Repo) rangedGet(ctx context.Context, key, etag string, off, length int64, what string) (io.ReadCloser, error) {
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
		if isPreconditionFailed(err) {
			return nil, fmt.Errorf("%s: %w: the object was replaced: %w", what, repository.ErrIntegrity, err)
		}
		if isNotFound(err) {
			return nil, fmt.Errorf("%s: %w: %w", what, repository.ErrNotFound, err)
		}
		return nil, ctxErr(ctx, fmt.Errorf("get %s [%d, %d): %w", key, off, off+length, err))
	}
	if info.Size != length {
		body.Close()
		return nil, fmt.Errorf("get %s [%d, %d): the store answered %d bytes", key, off, off+length, info.Size)
	}
	return body, nil
}

// Ref implements memdev.Source.
func (m *memorySource) Ref() string { return "s3-memory:" + m.obj.ID }

// Size implements repository.MemorySource.
func (m *memorySource) Size() int64 { return m.obj.Size }

// Open implements memdev.Source: the reader pins the object (and its
// startup pack) in the chunk cache until it is closed. Its reads end with
// their context (memdev.ContextReaderAt), and it drops a copy the
// device's check refused (integrity.Uncacher).
func (m *memorySource) Open() (memdev.Lower, error) {
	rd, err := m.r.cache.Open(m.obj)
	if err != nil {
		return nil, err
	}
	if m.pack == nil {
		return rd, nil
	}
	prd, err := m.r.cache.Open(m.pack.obj)
	if err != nil {
		rd.Close()
		return nil, err
	}
	return &packedReader{cache: m.r.cache, mem: rd, pack: prd, spans: m.pack.spans, check: m.pack.check, skipped: &m.packSkipped}, nil
}

// OpenStoreMemory reads the memory straight from the store, past the
// node cache: what snapshot verify reads, so that blocks this node cached
// do not stand in for the store's copy, which every other node reads.
// Chunks are checked against their digests as fetched; only the last
// chunk fetched is kept, for the reads within it. ctx bounds every read.
func (m *memorySource) OpenStoreMemory(ctx context.Context) memdev.Lower {
	return &storeReader{ctx: ctx, obj: m.obj, window: m.chunkBytes}
}

// storeReader is a memdev.Lower of an object's fetches. With a window (a
// chunked memory's chunk size) it fetches whole chunk-aligned windows and
// serves reads from the last one: a chunk object is compressed whole, so
// a read of part of a chunk costs the whole chunk, and reading a chunk in
// pieces must not fetch it once per piece.
type storeReader struct {
	ctx    context.Context
	obj    chunkcache.Object
	window int64

	mu  sync.Mutex
	at  int64  // offset of buf in the memory
	buf []byte // the last window fetched
	// damaged is the last window found damaged (its offset, and the
	// error): reads within it fail at once instead of fetching the whole
	// chunk again for every piece.
	damagedAt  int64
	damagedErr error
}

func (s *storeReader) Size() int64 { return s.obj.Size }

// Close lets the window go.
func (s *storeReader) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = nil
	return nil
}

func (s *storeReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read memory at %d: negative offset", off)
	}
	if off >= s.obj.Size {
		return 0, io.EOF
	}
	want := int(min(int64(len(p)), s.obj.Size-off))
	var n int
	var err error
	if s.window <= 0 {
		n, err = s.fetch(p[:want], off)
	} else {
		n, err = s.readWindowed(p[:want], off)
	}
	if err == nil && want < len(p) {
		err = io.EOF
	}
	return n, err
}

// readWindowed fills p from the windows holding [off, off+len(p)).
func (s *storeReader) readWindowed(p []byte, off int64) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for n < len(p) {
		at := off + int64(n)
		if s.buf == nil || at < s.at || at >= s.at+int64(len(s.buf)) {
			lo := at - at%s.window
			if s.damagedErr != nil && lo == s.damagedAt {
				return n, s.damagedErr
			}
			buf := make([]byte, min(s.window, s.obj.Size-lo))
			if _, err := s.fetch(buf, lo); err != nil {
				s.buf = nil
				if errors.Is(err, repository.ErrIntegrity) || errors.Is(err, repository.ErrNotFound) {
					s.damagedAt, s.damagedErr = lo, err
				}
				return n, err
			}
			s.at, s.buf = lo, buf
		}
		n += copy(p[n:], s.buf[at-s.at:])
	}
	return n, nil
}

// fetch reads [off, off+len(p)) with one fetch of the object.
func (s *storeReader) fetch(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	body, err := s.obj.Fetch(s.ctx, off, int64(len(p)))
	if err != nil {
		return 0, err
	}
	defer body.Close()
	n, err := io.ReadFull(body, p)
	if err != nil {
		return n, fmt.Errorf("read memory [%d, %d) from the store: %w", off, off+int64(len(p)), err)
	}
	return n, nil
}

// Unanswered implements restore.StallReporter: the requests of this
// node's client the store keeps waiting now (sent and not answered, or a
// body that stopped coming), nil when there is none. Reads of a restore
// given up while they wait end with its cancellation; this says what they
// were waiting for.
func (m *memorySource) Unanswered() error { return m.r.counter.stall.unanswered() }

// StartupPackSkipped implements restore.PackSkipper: why this source
// went without its startup pack so far, nil while it uses it or has none.
func (m *memorySource) StartupPackSkipped() error {
	if err := m.packSkipped.get(); err != nil {
		return err
	}
	if w := m.stream.Load(); w != nil && w.Err() != nil {
		return fmt.Errorf("startup pack stream: %w", w.Err())
	}
	return nil
}

// StreamStartup implements repository.CacheWarmer: with a startup pack, it
// streams the pack into the chunk cache, front to back, in few large
// ranged GETs: exactly the startup set, in first-touch order. Every frame
// is checked against its digest before the cache keeps any byte of it, so
// the stream needs no manifest. Without a pack it returns nil, nil.
func (m *memorySource) StreamStartup() (repository.CacheWarm, error) {
	if m.pack == nil {
		return nil, nil
	}
	whole := []chunkcache.Range{{Offset: 0, Length: m.pack.obj.Size}}
	w, err := m.warm(m.pack.obj, whole, PackWarmOptions(m.r.warm))
	if err != nil {
		return nil, err
	}
	m.stream.Store(w)
	return w, nil
}

// WarmCache implements repository.CacheWarmer: the pack when there is one,
// else the blocks the manifest's ranges touch, in first-touch order.
func (m *memorySource) WarmCache(ranges []manifest.Range) (repository.CacheWarm, error) {
	if m.pack != nil {
		return m.StreamStartup()
	}
	rs := make([]chunkcache.Range, len(ranges))
	for i, r := range ranges {
		rs[i] = chunkcache.Range{Offset: r.Offset, Length: r.Length}
	}
	w, err := m.warm(m.obj, rs, m.r.warm)
	if err != nil {
		return nil, err
	}
	return w, nil
}

// warm starts a warming that counts as a streaming startup set, which the
// background fill of any snapshot on this node waits for.
func (m *memorySource) warm(obj chunkcache.Object, rs []chunkcache.Range, o chunkcache.WarmOptions) (*chunkcache.Warming, error) {
	w, err := m.r.cache.Warm(obj, rs, o)
	if err != nil {
		return nil, err
	}
	m.r.fill.streaming(w)
	return w, nil
}

// PrefetchRanges implements restore.PrefetchTrimmer: the parts of ranges
// worth prefetching on this node. With a startup pack, a page the pack
// does not hold and whose chunk is not in the node cache would cost a
// whole chunk GET (256 times the page) before ready, competing with the
// stream: those pages are left to demand faults, which still jump the
// queue, so a pack that does not match the prefetched manifest (a
// refinement attached before its pack, a pack of an older refinement, one
// that failed to build) never turns into the whole memory. Without a pack
// every range is kept: the manifest's chunks are then the only way to get
// the startup set in ahead of the guest (WarmCache).
func (m *memorySource) PrefetchRanges(ranges []manifest.Range) []manifest.Range {
	if m.pack == nil {
		return ranges
	}
	block := m.r.cache.BlockBytes()
	var out []manifest.Range
	keep := func(off, length int64) {
		if n := len(out); n > 0 && out[n-1].End() == off {
			out[n-1].Length += length
			return
		}
		out = append(out, manifest.Range{Offset: off, Length: length})
	}
	for _, rg := range ranges {
		for _, pc := range cutBySpans(m.pack.spans, rg.Offset, rg.End()) {
			if pc.fromPack {
				keep(pc.memOff, pc.length)
				continue
			}
			for off := pc.memOff; off < pc.memOff+pc.length; {
				next := min((off/block+1)*block, pc.memOff+pc.length)
				if m.r.cache.Cached(m.obj.ID, off/block) {
					keep(off, next-off)
				}
				off = next
			}
		}
	}
	return out
}

// PackWarmOptions are the options the startup pack streams with, given
// the repository's (Options.Warm; zero fields take these defaults). The
// pack is read front to back, and the guest wants its front first: all
// runs at once would share the link evenly and deliver the front at a
// fraction of it, so a few shorter runs keep the link full (several
// connections) while the front arrives first, and their first GETs ramp
// up (chunkcache.Ramp: heads of 1, 2, .. blocks, then full runs) so that
// they do not all wait out the store's latency at once. Measured with the
// ramp of then (heads of i/workers of a run; docs/s3.md has the current
// one's figures) on the 128 MiB reference (35.2 MiB pack, 20 ms latency,
// 400 Mbit/s per connection, 1 Gbit/s link, 5 blocks, one-page
// readaround): 4 runs of 4 MiB 453 ms to ready with the ramp, 453 ms
// without; 6 of 2 MiB 419 and 435 ms; 8 of 2 MiB 438 and 455 ms; 4 of
// 8 MiB 473 and 581 ms. The guest's own wait on memory fell from 70-80 ms
// to 23-29 ms with the ramp.
func PackWarmOptions(o chunkcache.WarmOptions) chunkcache.WarmOptions {
	if o.Concurrency <= 0 {
		o.Concurrency = 6
	}
	if o.RunCapBytes <= 0 {
		o.RunCapBytes = 2 << 20
	}
	o.Ramp = true
	// The restore is still starting when its startup set is in: the
	// cache writes the set to disk once it is ready (RestoreReady) or
	// stopped.
	o.HoldWrites = true
	return o
}

// RestoreReady implements restore.ReadyNotifier: a restore of this memory
// is ready, so the rest of it may follow into the node cache.
func (m *memorySource) RestoreReady() {
	if w := m.stream.Load(); w != nil {
		w.ReleaseWrites()
	}
	m.r.fill.start(m.obj)
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
