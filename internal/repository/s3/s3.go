// Package s3 is the repository backend that keeps snapshots in an
// S3-compatible object store (AWS S3, MinIO, Ceph RGW, Alibaba OSS), shared
// by every node, and reads guest memory from it on demand through a
// node-local chunk cache (package chunkcache).
//
// # Client
//
// It uses minio-go v7 rather than aws-sdk-go-v2. Both sign requests for any
// S3-compatible store and both do ranged GETs; minio-go was chosen because
// it already is a dependency of this module, it exposes conditional PUTs
// (If-None-Match: * and If-Match: <etag>, PutObjectOptions.SetMatchETagExcept
// and SetMatchETag) and maps the 412 and 404 answers to typed error codes,
// its Core API sends a ranged GET as exactly one request with its metadata
// (no stat before the read), it lets the payload SHA-256 be given so the
// store verifies each uploaded part, and it carries the AWS credential
// chain (environment, shared file, web identity, container, IMDS). The AWS
// SDK would add a large dependency tree for the same requests.
//
// # Consistency
//
// The catalog (catalog.go) changes only by single conditional PUTs: the
// record, written last with If-None-Match: *, is the visibility point;
// aliases are bound with If-None-Match: * (exactly one of two binders
// wins); attaching a manifest or a digest table replaces the record with
// If-Match on the ETag it read, so it can never recreate a record a
// concurrent Delete removed.
// Delete removes the alias, then the record, then the artifacts; a failed
// publish removes what it wrote. Leases are seen by every node through
// lease objects that expire unless renewed (lease.go).
//
// # Storing memory
//
// Memory is stored as content-addressed chunks (chunks.go): publish cuts
// it into chunks of Options.ChunkBytes (1 MiB), leaves all-zero chunks
// out, compresses each other chunk on its own with zstd and uploads it as
// chunks/<SHA-256 of its bytes>.zst unless the bucket holds it already
// (one HEAD per chunk, 8 in parallel; each chunk named first in the
// publish's journal, journal.go), then writes the chunk map, the digest
// table and, last, the record, which names the memory format (record
// format 2: memory_format "chunks-v1"). Records of format 1 (one
// memory.bin object) are still read. A publish that fails removes what it
// wrote under artifacts/ at once, leaving the list of its chunks to the
// next garbage collection; one killed before its record leaves its
// artifacts, which Sweep reclaims once its lease has gone unrenewed for
// AbandonedPublishGraceMinutes (leftovers.go), listing its chunks the same
// way. A collection (gc.go) removes the listed chunks no snapshot, deleted
// snapshot within its grace, or publish in progress names, and any other
// unnamed chunk after ChunkGrace.
//
// # Reading memory
//
// Resolve downloads the VM state, manifest and chunk map (small) into a
// local file cache and returns the memory as a repository.MemorySource:
// the memory device reads it through the chunk cache, whose blocks are
// the chunks, each fetched with one GET, decoded and checked against its
// digest before any byte of it is served (zero chunks are made up without
// a request). Attaching a manifest also writes a startup pack (pack.go):
// the startup set's pages in first-touch order in compressed frames. A
// restore with prefetch streams it concurrently with the VM restore in a
// few large ranged GETs (WarmCache), so a cold node fetches the startup
// set and nothing else before ready; demand misses outside it fetch their
// chunk at once. Attaching a refinement (the learned manifest restores
// prefetch) names a refined pack of its set, rebuilt only when the set
// drifted from the pack and at most once per few learned restores
// (refinedpack.go); the device prefetch reads only what the pack streamed
// or the node cache holds (memorySource.PrefetchRanges), so no mismatch
// between pack and manifest turns learned pages into whole-chunk GETs.
// After ready the rest of the memory follows in the background (fill.go),
// bounded and yielding to startup sets.
//
// # Figures
//
// See the README's S3 section: the benchmark (package s3bench) with a
// node link cap, and the stored sizes.
package s3

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/chunkcache"
	"warmstart/internal/chunkmap"
	"warmstart/internal/integrity"
	"warmstart/internal/repository"
)

// cleanupTimeout bounds the removal of what a failed operation wrote; it
// runs even when the operation's context was cancelled, and tries again
// while the store does not answer, up to this long.
const cleanupTimeout = time.Minute

// cleanupAfterCancel bounds the clean-up of a failed publish once the
// publish's context has ended: a caller that gave up (a daemon shutting
// down) is not held for the cleanupTimeout a store that does not answer
// would take. On a store that answers it is time enough to remove
// everything; what a clean-up cut short leaves, snapshot gc reclaims
// (leftovers.go).
const cleanupAfterCancel = 2 * time.Second

// cleanupKey marks a context publishCleanupContext made.
type cleanupKey struct{}

// publishCleanupContext is the context of the clean-up of a failed
// publish on ctx: it outlives ctx, for cleanupTimeout, but ends
// cleanupAfterCancel after ctx ended (or after now, if ctx has ended).
// Given such a clean-up context, it ends with it: the steps of one
// clean-up share its bound.
func publishCleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Value(cleanupKey{}) != nil {
		return context.WithCancel(ctx)
	}
	cctx, cancel := context.WithTimeout(context.WithValue(context.WithoutCancel(ctx), cleanupKey{}, true), cleanupTimeout)
	var cut *time.Timer
	var mu sync.Mutex
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		cut = time.AfterFunc(cleanupAfterCancel, cancel)
	})
	return cctx, func() {
		stop()
		mu.Lock()
		if cut != nil {
			cut.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// Options configure a Repo.
type Options struct {
	// Endpoint is host[:port] (HTTPS) or http(s)://host[:port]; empty
	// means AWS S3.
	Endpoint string
	Bucket   string
	Region   string
	// Prefix is prepended to every key ("" or a path; a trailing slash is
	// added).
	Prefix string
	// AddressingStyle is AddressingAuto (also ""), AddressingPath or
	// AddressingVirtual.
	AddressingStyle string
	// AccessKeyID and SecretAccessKey are static credentials; when both
	// are empty the AWS environment and credential chain apply.
	AccessKeyID, SecretAccessKey string

	// CacheDir holds the node-local caches: the chunk cache's chunks/
	// (memory blocks) and files/ (VM states and manifests). Required.
	CacheDir string
	// CacheMaxBytes bounds the memory blocks cached. Required unless Cache
	// is given.
	CacheMaxBytes int64
	// BlockBytes is the chunk cache block size; zero means the default.
	BlockBytes int64
	// Cache, when set, is used instead of opening one in CacheDir, so
	// several repositories on a node share one bound.
	Cache *chunkcache.Cache
	// Warm tunes the prefetch executor.
	Warm chunkcache.WarmOptions
	// Transport, when set, carries the HTTP requests (tests put a fault
	// injector here); nil means minio-go's default with ResponseTimeout.
	Transport http.RoundTripper
	// ResponseTimeout bounds how long one request waits for the store's
	// response headers once it is sent, and how long a read of a response
	// body waits for its next byte; zero means DefaultResponseTimeout.
	// It applies to the default transport only.
	ResponseTimeout time.Duration
	// ReadOnly opens the repository for the verbs that only read (list,
	// show, restore, verify): nothing is written to the bucket, nothing is
	// swept, and nothing is created at Open. The node-local caches are
	// opened (and created) only when a snapshot is first resolved, since
	// reading memory goes through them; a daemon may have the same cache
	// directory open, and the chunk cache then removes none of its files
	// (chunkcache's lock.go). Operations that change the repository fail
	// with ErrInvalidRequest.
	ReadOnly bool
	// ChunkBytes is the chunk size publish cuts memory into; zero means
	// chunkmap.DefaultChunkBytes.
	ChunkBytes int64
	// Fill bounds the background fill of a restored snapshot's remaining
	// chunks; see FillOptions.
	Fill FillOptions
	// ChunkGrace replaces ChunkGrace when positive. Every node on one
	// bucket must use the same grace: a publish's reuse of chunks is safe
	// against a collection only under the collector's grace.
	ChunkGrace time.Duration
	// LeaseTTL replaces LeaseTTL when positive (see lease.go).
	LeaseTTL time.Duration
	// SigningKey, when set, signs every record Publish commits
	// (repository.SignRecord), so a snapshot is visible only signed.
	SigningKey ed25519.PrivateKey
	// AbandonedGrace replaces AbandonedPublishGrace when positive; it is
	// raised to the lease TTL if shorter (see leftovers.go).
	AbandonedGrace time.Duration
	// Log receives the node cache's warnings (a damaged block discarded, a
	// cache too small for what restores read); nil discards them.
	Log *slog.Logger
}

// Repo is a snapshot repository in one bucket under one prefix.
type Repo struct {
	core     *minio.Core
	counter  *countingTransport
	bucket   string
	keys     keys
	cache    *chunkcache.Cache
	ownCache bool
	filesDir string
	warm     chunkcache.WarmOptions
	// chunkBytes is the chunk size of publishes.
	chunkBytes int64
	// chunksSkipped counts chunks publish found in the bucket already.
	chunksSkipped atomic.Uint64
	fill          *filler

	leaseMu    sync.Mutex
	liveLeases map[string][]*leaseHold
	locks      idLocks

	// readOnly refuses changes (Options.ReadOnly); localOnce opens the
	// node-local caches, at Open for writers, at the first Resolve else.
	readOnly  bool
	localOnce sync.Once
	localErr  error
	opts      Options

	// aliasGrace is AliasBindGrace; tests shorten it.
	aliasGrace time.Duration
	// chunkGrace is ChunkGrace; tests shorten it.
	chunkGrace time.Duration
	// leaseTTL is LeaseTTL; tests shorten it.
	leaseTTL time.Duration
	// abandonedGrace is AbandonedPublishGrace; tests shorten it.
	abandonedGrace time.Duration
	// beforeRecord, when a test sets it, runs between binding the alias
	// and writing the record of a publish; afterConfirmLease between the
	// confirmation of a publish's or a flatten's lease and its record's
	// write.
	beforeRecord, afterConfirmLease func()
	// layerFault, when a test sets it, runs at each step of a layer
	// publish (LayerFaultPoints); nil everywhere else.
	layerFault func(point string)
	// afterMarker and afterMarkDeleting, when a test sets them, run
	// between the write and the read of each side of the dependents
	// protocol (dependents.go): after a publish PUT its marker at owner,
	// after a delete marked its record deleting.
	afterMarker       func(owner string)
	afterMarkDeleting func()
	// beforeMarkDeleting, when a test sets it, runs between a delete's
	// read of the record and its deleting mark.
	beforeMarkDeleting func()
	// cleanupRetry, when a test sets it, is told of each failed attempt to
	// remove what a failed publish wrote.
	cleanupRetry func(error)
	// beforeAliasCreate, when a test sets it, runs between bindAlias's
	// check of the quarantine and its exclusive create.
	beforeAliasCreate func()
	// beforeResolveDigests, when a test sets it, runs in Resolve after
	// the record and the VM state were read and before the digest table
	// is fetched.
	beforeResolveDigests func(id string)
	// beforeAttachRecord, when a test sets it, runs between uploading an
	// attachment's object and writing the record that describes it.
	beforeAttachRecord func()
	// beforeRefinedPack, when a test sets it, runs before a refinement
	// attach builds a refined pack; an error it returns fails the build.
	beforeRefinedPack func() error
	// beforeAliasRelease, when a test sets it, runs between reading an
	// alias binding and releasing it (putReleased).
	beforeAliasRelease func(alias string)
	// afterAliasRelease, set by tests, runs after a binding is released.
	afterAliasRelease func(alias string)
	// beforeRemoveChunk, when a test sets it, runs in a collection between
	// its last age check of a chunk and the chunk's removal;
	// awaitingCollection each time a publish finds a collection it must
	// wait for.
	beforeRemoveChunk  func(key string)
	awaitingCollection func()
	// beforeSweepLease, when a test sets it, runs in a sweep between its
	// listing of an expired lease object and its removal.
	beforeSweepLease func(key string)
	// collectorTTL is CollectorTTL; tests shorten it.
	collectorTTL time.Duration
}

var _ repository.Repository = (*Repo)(nil)

// Open connects to the bucket (which must exist) and opens the node-local
// caches. It checks that the bucket is reachable.
func Open(ctx context.Context, o Options) (*Repo, error) {
	if o.Bucket == "" {
		return nil, fmt.Errorf("open s3 repository: %w: no bucket given", repository.ErrInvalidRequest)
	}
	if o.CacheDir == "" {
		return nil, fmt.Errorf("open s3 repository: %w: no cache directory given", repository.ErrInvalidRequest)
	}
	prefix, err := normalizePrefix(o.Prefix)
	if err != nil {
		return nil, fmt.Errorf("open s3 repository: %w", err)
	}
	core, counter, err := newClient(o)
	if err != nil {
		return nil, fmt.Errorf("open s3 repository: %w", err)
	}
	r, err := newRepo(o, prefix, core, counter)
	if err != nil {
		return nil, err
	}
	ok, err := core.BucketExists(ctx, o.Bucket)
	if err != nil {
		return nil, fmt.Errorf("open s3 repository %s: %w", o.Bucket, schemeHint(o.Endpoint, ctxErr(ctx, err)))
	}
	if !ok {
		return nil, fmt.Errorf("open s3 repository: bucket %s: %w", o.Bucket, ErrNoBucket)
	}
	if o.ReadOnly {
		return r, nil
	}
	if err := r.openLocal(); err != nil {
		return nil, fmt.Errorf("open s3 repository: %w", err)
	}
	return r, nil
}

// newRepo is a repository of o's bucket and prefix reached through
// core, its node caches not opened yet.
func newRepo(o Options, prefix string, core *minio.Core, counter *countingTransport) (*Repo, error) {
	r := &Repo{
		core: core, counter: counter, bucket: o.Bucket, keys: keys{prefix},
		filesDir: filepath.Join(o.CacheDir, "files"), warm: o.Warm, chunkBytes: o.ChunkBytes,
		liveLeases: make(map[string][]*leaseHold), aliasGrace: AliasBindGrace, chunkGrace: ChunkGrace, leaseTTL: LeaseTTL, collectorTTL: CollectorTTL,
		readOnly: o.ReadOnly, opts: o,
	}
	if r.chunkBytes == 0 {
		r.chunkBytes = chunkmap.DefaultChunkBytes
	}
	if o.ChunkGrace > 0 {
		r.chunkGrace = o.ChunkGrace
	}
	if o.LeaseTTL > 0 {
		r.leaseTTL = o.LeaseTTL
	}
	r.abandonedGrace = AbandonedPublishGrace
	if o.AbandonedGrace > 0 {
		r.abandonedGrace = o.AbandonedGrace
	}
	r.abandonedGrace = max(r.abandonedGrace, r.leaseTTL)
	if r.chunkBytes < 4096 || r.chunkBytes > chunkmap.MaxChunkBytes || r.chunkBytes%4096 != 0 {
		return nil, fmt.Errorf("open s3 repository: %w: chunk size %d is not a multiple of 4096 up to %d",
			repository.ErrInvalidRequest, r.chunkBytes, chunkmap.MaxChunkBytes)
	}
	return r, nil
}

// openLocal opens the node-local caches once: the files directory, the
// chunk cache and the background fill that writes into it.
func (r *Repo) openLocal() error {
	r.localOnce.Do(func() {
		if err := os.MkdirAll(r.filesDir, 0o700); err != nil { // VM states: private
			r.localErr = err
			return
		}
		r.cache = r.opts.Cache
		if r.cache == nil {
			cache, err := chunkcache.Open(chunkcache.Options{
				Dir: r.opts.CacheDir, MaxBytes: r.opts.CacheMaxBytes, BlockBytes: r.opts.BlockBytes, Log: r.opts.Log,
			})
			if err != nil {
				r.localErr = err
				return
			}
			r.cache, r.ownCache = cache, true
		}
		r.fill = newFiller(r.cache, r.opts.Fill)
	})
	return r.localErr
}

// writable refuses changes to a repository opened read-only.
func (r *Repo) writable() error {
	if r.readOnly {
		return fmt.Errorf("%w: s3 repository %s is open read-only", repository.ErrInvalidRequest, r.bucket)
	}
	return nil
}

// Close stops the background fill and closes the chunk cache if Open
// opened it.
func (r *Repo) Close() error {
	r.localOnce.Do(func() {}) // no cache is opened after Close
	if r.fill != nil {
		r.fill.close()
	}
	if r.ownCache {
		return r.cache.Close()
	}
	return nil
}

// Cache is the chunk cache memory is read through.
func (r *Repo) Cache() *chunkcache.Cache { return r.cache }

// WaitFill waits for the background fills running now to end.
func (r *Repo) WaitFill() {
	if r.fill != nil {
		r.fill.wait()
	}
}

// ChunksSkipped is how many chunks publishes found in the bucket already
// and did not upload.
func (r *Repo) ChunksSkipped() uint64 { return r.chunksSkipped.Load() }

// RequestStats returns the HTTP requests sent so far.
func (r *Repo) RequestStats() RequestStats { return r.counter.stats() }

// BeginCapture implements repository.Repository.
func (r *Repo) BeginCapture(ctx context.Context) (repository.Lease, error) {
	if err := r.writable(); err != nil {
		return nil, fmt.Errorf("begin capture: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("begin capture: %w", err)
	}
	id, err := repository.NewID()
	if err != nil {
		return nil, fmt.Errorf("begin capture: %w", err)
	}
	lease, err := r.newLease(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("begin capture: %w", err)
	}
	return lease, nil
}

// LeaseExisting implements repository.Repository.
func (r *Repo) LeaseExisting(ctx context.Context, id string) (repository.Lease, error) {
	if err := repository.ValidateID(id); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	if err := r.writable(); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	if _, _, err := r.getRecord(ctx, id); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	lease, err := r.newLease(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	return lease, nil
}

// Publish implements repository.Repository.
func (r *Repo) Publish(ctx context.Context, lz repository.Lease, req repository.PublishRequest) (repository.Record, error) {
	return repository.PublishUnderLease(r, lz, func(id string) (repository.Record, error) { return r.publish(ctx, id, req) })
}

func (r *Repo) publish(ctx context.Context, id string, req repository.PublishRequest) (repository.Record, error) {
	sizes, err := repository.CheckPublish(req)
	if err != nil {
		return repository.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return repository.Record{}, err
	}
	return r.publishWith(ctx, id, req.Alias, publishSteps{
		store: func() (repository.Record, error) {
			vm, err := r.upload(ctx, id, repository.VMStateFileName, req.VMStatePath, sizes.VMState, nil, req.Progress)
			if err != nil {
				return repository.Record{}, onField(repository.FieldVMState, err)
			}
			mem, err := r.storeMemory(ctx, id, repository.BaseLayerName, req.MemoryPath, sizes.Memory, req.Progress)
			if err != nil {
				return repository.Record{}, onField(repository.FieldMemory, err)
			}
			return r.newRecord(id, req, vm, mem)
		},
		beforeRecord: r.beforeRecord,
	})
}

// publishSteps are what a publish (Publish, PublishLayer) does beyond the
// steps every publish shares: store writes the artifacts and returns the
// record; undo, when set, runs before the shared clean-up of a publish
// that failed, with the clean-up's context; the hooks, when set, run
// after store, before the record and after it (the tests' fault points).
type publishSteps struct {
	store                                 func() (repository.Record, error)
	undo                                  func(cctx context.Context)
	afterStore, beforeRecord, afterRecord func()
}

// publishWith publishes id under its lock: checks it may, stores its
// artifacts, binds alias, writes the record last (the single visibility
// point) and removes what it wrote when any step fails.
func (r *Repo) publishWith(ctx context.Context, id, alias string, steps publishSteps) (_ repository.Record, err error) {
	unlock := r.locks.lock(id)
	defer unlock()
	if err := r.checkPublishable(ctx, id, alias); err != nil {
		return repository.Record{}, err
	}
	published, aliasBound := false, false
	defer func() {
		if published {
			return
		}
		if errors.Is(err, errRecordMayStand) {
			// Everything stays for the record that may have landed;
			// snapshot gc reclaims it all if it did not.
			return
		}
		cctx, cancel := publishCleanupContext(ctx)
		defer cancel()
		if steps.undo != nil {
			steps.undo(cctx)
		}
		err = r.undoPublish(cctx, id, alias, aliasBound, err)
	}()
	rec, err := steps.store()
	if err != nil {
		return repository.Record{}, err
	}
	run(steps.afterStore)
	if alias != "" {
		if err := r.bindAlias(ctx, alias, id); err != nil {
			return repository.Record{}, err
		}
		aliasBound = true
	}
	run(steps.beforeRecord)
	if err := r.commitUnderLease(ctx, rec); err != nil {
		return repository.Record{}, err
	}
	published = true
	run(steps.afterRecord)
	// The chunk map names the journal's chunks now. Best effort: a journal
	// left names what the map names, and goes with the other artifacts.
	_ = r.remove(ctx, r.keys.artifact(id, journalName))
	return rec, nil
}

// run calls hook when it is set.
func run(hook func()) {
	if hook != nil {
		hook()
	}
}

// checkPublishable refuses a publish of id the repository cannot take:
// one already published, and, failing fast before a long upload, one
// under an alias plainly taken (the binding itself is decided by one
// conditional PUT at the end).
func (r *Repo) checkPublishable(ctx context.Context, id, alias string) error {
	switch _, _, err := r.getRecord(ctx, id); {
	case err == nil || errors.Is(err, repository.ErrIntegrity):
		return fmt.Errorf("%w: the lease's snapshot is already published", repository.ErrInvalidRequest)
	case !errors.Is(err, repository.ErrNotFound):
		return err
	}
	if alias == "" {
		return nil
	}
	return r.checkAliasFree(ctx, alias, id)
}

// newRecord is the record a publish of id commits: its chunked memory
// described, signed when the repository has a key.
func (r *Repo) newRecord(id string, req repository.PublishRequest, vm storedArtifact, mem storedMemory) (repository.Record, error) {
	rec := repository.NewRecord(id, req, vm.stored(), mem.uploaded.stored(), mem.tables)
	rec.MemoryFormat = repository.MemoryFormatChunks
	rec.MemoryChunks = &repository.ChunkMapDescriptor{SHA256: sha256Hex(mem.chunkMap), Size: int64(len(mem.chunkMap)),
		ChunkBytes: mem.chunks.ChunkBytes, StoredBytes: mem.chunks.StoredBytes()}
	return repository.SignRecord(rec, r.opts.SigningKey)
}

// storedMemory is a publish's memory in the bucket: its chunks, their map
// and the digest tables.
type storedMemory struct {
	uploaded storedArtifact
	chunks   chunkmap.Map
	chunkMap []byte
	tables   repository.DigestTables
}

// storeMemory uploads the memory file's chunks the bucket lacks, each
// named in the publish's journal first, then the digest tables and the
// chunk map, then (once every collection that may have missed the journal
// or the map has ended) confirms every chunk is there.
//
// name is the layer name the objects are stored under: BaseLayerName for
// a snapshot's memory file (memory.digests, memory.chunks, ...), a diff
// layer's own name for a paused child's layer.
func (r *Repo) storeMemory(ctx context.Context, id, name, path string, size int64, progress func(repository.ImportProgress)) (storedMemory, error) {
	tables := integrity.NewTables(size)
	up, chunks, err := r.uploadChunked(ctx, id, path, size, tables, progress)
	if err != nil {
		return storedMemory{}, err
	}
	mem := storedMemory{uploaded: up, chunks: chunks, chunkMap: chunks.Encode(), tables: repository.EncodeTables(tables)}
	for file, table := range map[string][]byte{repository.LayerDigestsFile(name): mem.tables.CRC, repository.LayerSHA256DigestsFile(name): mem.tables.SHA256} {
		if _, err := r.putSmall(ctx, r.keys.artifact(id, file), table, putCondition{}); err != nil {
			return storedMemory{}, err
		}
	}
	mapKey := r.keys.artifact(id, layerChunkMapName(name))
	if _, err := r.putSmall(ctx, mapKey, mem.chunkMap, putCondition{}); err != nil {
		return storedMemory{}, err
	}
	if err := r.awaitCollections(ctx, mapKey); err != nil {
		return storedMemory{}, err
	}
	if err := r.confirmChunks(ctx, path, chunks); err != nil {
		return storedMemory{}, err
	}
	return mem, nil
}

// commitRecord writes the new record, the visibility point. If the answer
// to a PUT that reached the store is lost, minio-go's retry finds the
// record there (412); it is ours if it is the one we wrote.
func (r *Repo) commitRecord(ctx context.Context, rec repository.Record) error {
	_, err := r.putRecord(ctx, rec, putCondition{ifNoneMatch: true})
	if errors.Is(err, errPrecondition) {
		// A record is there: ours, if a write whose answer was lost
		// landed (the client's retry then found it). Unless it reads as
		// another's, it may be ours, and it names the objects under id
		// either way: nothing of the publish may go (errRecordMayStand).
		got, _, gerr := r.getRecord(ctx, rec.ID)
		switch {
		case gerr != nil:
			return fmt.Errorf("record of %s: a record is there, and reading it back failed: %w (%w)", rec.ID, errRecordMayStand, gerr)
		case got.CreatedAt.Equal(rec.CreatedAt) && got.MemorySHA256 == rec.MemorySHA256:
			return nil
		}
		return fmt.Errorf("%w: the lease's snapshot is already published (%w)", repository.ErrInvalidRequest, errRecordMayStand)
	}
	if err != nil {
		// The PUT may have landed before the failure: take it back before
		// the artifacts go. If that fails too, nothing of the publish may
		// go (errRecordMayStand).
		cctx, cancel := publishCleanupContext(ctx)
		defer cancel()
		if rerr := r.remove(cctx, r.keys.record(rec.ID)); rerr != nil {
			return fmt.Errorf("%w; %w (taking it back failed: %w)", err, errRecordMayStand, rerr)
		}
		return err
	}
	return nil
}

// errRecordMayStand: a record write failed and taking the record back
// failed too, so it may stand; the failed publish then removes nothing it
// wrote (a record must never name missing objects), and snapshot gc
// reclaims it all if the record is absent (reclaimAbandoned reads it).
var errRecordMayStand = errors.New("the record may have been written")

// AttachManifest implements repository.Repository.
func (r *Repo) AttachManifest(ctx context.Context, lz repository.Lease, data []byte, rec *repository.Recording) (repository.ManifestDescriptor, error) {
	return repository.AttachManifestUnderLease(r, lz, data, rec, r.attacher(ctx))
}

// AttachDigests implements repository.Repository.
func (r *Repo) AttachDigests(ctx context.Context, lz repository.Lease, data []byte) (repository.DigestsDescriptor, error) {
	return repository.AttachDigestsUnderLease(r, lz, data, r.attacher(ctx))
}

// AttachRefinement implements repository.Repository.
func (r *Repo) AttachRefinement(ctx context.Context, lz repository.Lease, ref repository.Refinement) (repository.RefinementDescriptor, error) {
	return repository.AttachRefinementUnderLease(r, lz, ref, r.attacher(ctx))
}

// AttachSignature implements repository.Repository.
func (r *Repo) AttachSignature(ctx context.Context, lz repository.Lease, sig repository.Signature) error {
	return repository.AttachSignatureUnderLease(r, lz, sig, r.attacher(ctx))
}

func (r *Repo) attacher(ctx context.Context) repository.Attacher {
	return func(id string, a repository.Attachment) error { return r.attach(ctx, id, a) }
}

// maxAttachAttempts bounds how often attach starts over after the record
// changed under it (a concurrent attach from another process, or a lost
// answer that minio-go retried).
const maxAttachAttempts = 5

// attach uploads a's object and then replaces the record with one that
// describes it, conditionally on the ETag the record was read with, so it
// never recreates a record a concurrent Delete removed.
func (r *Repo) attach(ctx context.Context, id string, a repository.Attachment) error {
	unlock := r.locks.lock(id)
	defer unlock()
	for range maxAttachAttempts {
		rec, etag, err := r.getRecord(ctx, id)
		if err != nil {
			return err
		}
		if err := a.Check(rec); err != nil {
			return err
		}
		again, err := r.attachOnce(ctx, rec, etag, a)
		if !again {
			return err
		}
	}
	return fmt.Errorf("record %s kept changing under %d attach attempts", id, maxAttachAttempts)
}

// attachOnce makes one attempt of attach from the record rec read with
// etag. It reports again when the record changed in the meantime.
func (r *Repo) attachOnce(ctx context.Context, rec repository.Record, etag string, a repository.Attachment) (again bool, err error) {
	id := rec.ID
	if has, same := a.DescribedBy(rec); has && !same {
		// Drop the old descriptor before replacing the object, so a crash
		// in between never pairs a descriptor with other bytes.
		etag, err = r.putRecord(ctx, a.Cleared(rec), putCondition{ifMatch: etag})
		switch {
		case errors.Is(err, errPrecondition):
			return true, nil
		case errors.Is(err, errGone):
			return false, fmt.Errorf("snapshot %s: %w", id, repository.ErrNotFound)
		case err != nil:
			return false, err
		}
	}
	key, err := r.putAttachedObject(ctx, id, a)
	if err != nil {
		return false, err
	}
	next := r.withPacks(ctx, rec, a)
	if r.beforeAttachRecord != nil {
		r.beforeAttachRecord()
	}
	_, err = r.putRecord(ctx, next, putCondition{ifMatch: etag})
	switch {
	case errors.Is(err, errPrecondition):
		return true, nil
	case errors.Is(err, errGone):
		// Deleted under us: the record stays deleted, and the objects just
		// written go with the rest of the snapshot.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if key != "" {
			_ = r.remove(cctx, key)
		}
		r.removeSupersededPacks(cctx, id, next, repository.Record{})
		return false, fmt.Errorf("snapshot %s: %w", id, repository.ErrNotFound)
	case err != nil:
		return false, err
	}
	if old := a.Superseded(rec); old != "" && old != a.Name {
		// Best effort: an object left here is named by no record, and
		// Delete removes every artifact of the snapshot.
		_ = r.remove(ctx, r.keys.artifact(id, old))
	}
	r.removeSupersededPacks(ctx, id, rec, next)
	return false, nil
}

// putAttachedObject uploads a's file, if it has one, and returns its key
// ("" for none).
func (r *Repo) putAttachedObject(ctx context.Context, id string, a repository.Attachment) (string, error) {
	if !a.HasFile() {
		return "", nil
	}
	key := r.keys.artifact(id, a.Name)
	if _, err := r.core.PutObject(ctx, r.bucket, key, bytes.NewReader(a.Data), int64(len(a.Data)), "", sha256Hex(a.Data),
		minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
		return "", ctxErr(ctx, fmt.Errorf("upload %s: %w", key, err))
	}
	return key, nil
}

// withPacks is the record after attaching a to rec, with the startup packs
// it names: a new recorded manifest gets its pack, a refinement the pack a
// restore prefetching it streams (refinedpack.go). Without a pack a cold
// node is slower, still correct, so a failed build does not fail the
// attach.
func (r *Repo) withPacks(ctx context.Context, rec repository.Record, a repository.Attachment) repository.Record {
	next := a.Attached(rec)
	switch {
	case a.Name == repository.ManifestFileName && next.StartupPack == nil:
		if pack, err := r.buildPack(ctx, rec, a.Data); err == nil {
			next.StartupPack = pack
		}
	case a.RefinedManifest() != nil:
		next.RefinedPack = r.refinedPackFor(ctx, rec, a)
	}
	return next
}

// Get implements repository.Repository.
func (r *Repo) Get(ctx context.Context, id string) (repository.Record, error) {
	if err := repository.ValidateID(id); err != nil {
		return repository.Record{}, fmt.Errorf("get: %w", err)
	}
	rec, _, err := r.getRecord(ctx, id)
	if errors.Is(err, repository.ErrNotFound) {
		// A quarantined record is damaged, not gone (see posixfs.Get).
		if q, _ := r.exists(ctx, r.keys.quarantinedRecord(id)); q {
			return rec, fmt.Errorf("record %s: %w: it did not decode and is in quarantine", id, repository.ErrIntegrity)
		}
	}
	return rec, err
}

// List implements repository.Repository.
func (r *Repo) List(ctx context.Context, f repository.Filter) ([]repository.Record, error) {
	return repository.ListRecords(ctx, f, r.recordIDs, func(ctx context.Context, id string) (repository.Record, error) {
		rec, _, err := r.getRecord(ctx, id)
		if err != nil {
			return repository.Record{}, fmt.Errorf("list: %w", err)
		}
		return rec, nil
	})
}

// recordIDs lists the ids that have a record object.
func (r *Repo) recordIDs(ctx context.Context) ([]string, error) {
	objs, err := r.list(ctx, r.keys.recordsPrefix())
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	var ids []string
	for _, o := range objs {
		if id, ok := r.keys.idFromRecordKey(o.Key); ok {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// ResolveAlias implements repository.Repository.
func (r *Repo) ResolveAlias(ctx context.Context, alias string) (string, error) {
	return repository.ResolveAlias(ctx, alias, r.resolveAlias)
}

// Lookup implements repository.Repository.
func (r *Repo) Lookup(ctx context.Context, ref string) (repository.Record, error) {
	return repository.Lookup(ctx, ref, r.Get, r.resolveAlias)
}

// Delete implements repository.Repository.
func (r *Repo) Delete(ctx context.Context, id string) error {
	if err := repository.ValidateID(id); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if err := r.writable(); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if err := r.delete(ctx, id); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	return nil
}

func (r *Repo) delete(ctx context.Context, id string) error {
	unlock := r.locks.lock(id)
	defer unlock()
	rec, err := r.beginDelete(ctx, id)
	if errors.Is(err, repository.ErrNotFound) {
		return r.deleteQuarantined(ctx, id)
	}
	if err != nil {
		return err
	}
	// Restores of it on other nodes may still need its chunks.
	if err := r.writeTombstone(ctx, rec); err != nil {
		return err
	}
	// Record first, as the POSIX store does: once it is gone nobody can
	// see the snapshot, and a binding still naming it is recognisably
	// stale (a dangling alias, which the next publisher takes over).
	// Releasing the alias first would leave a record carrying an alias
	// bound to nothing, or to a newer snapshot, for as long as the rest
	// of the delete takes: a catalog that contradicts itself to every
	// listing and verify of that moment.
	if err := r.remove(ctx, r.keys.record(id)); err != nil {
		return err
	}
	if rec.Alias != "" {
		if err := r.removeAlias(ctx, rec.Alias, id); err != nil {
			return err
		}
	}
	if err := r.releaseBindingsOf(ctx, id); err != nil {
		return err
	}
	// Its markers at its owners went stale with the record.
	r.unregister(ctx, id, rec.Owners())
	return r.removeArtifacts(ctx, id)
}

// deleteMarkTries bounds how often a delete re-reads a record that another
// node changed (attached a manifest, say) between its read and its
// deleting mark.
const deleteMarkTries = 8

// beginDelete reads id's record and marks it deleting, once no dependent
// needs it. A record changed by another writer in between is read again:
// the change (an attach) does not make the delete wrong, only its etag
// stale. ErrNotFound when there is no record.
func (r *Repo) beginDelete(ctx context.Context, id string) (repository.Record, error) {
	for try := 1; ; try++ {
		rec, etag, err := r.getRecord(ctx, id)
		switch {
		case errors.Is(err, repository.ErrIntegrity):
			// Undecodable, so its alias is unknown: releaseBindingsOf
			// finds every binding naming it.
			return repository.Record{ID: id}, r.checkNoDependents(ctx, id)
		case err != nil:
			return rec, err
		}
		if r.beforeMarkDeleting != nil {
			r.beforeMarkDeleting()
		}
		err = r.markDeleting(ctx, rec, etag)
		if !errors.Is(err, errRecordChanged) || try == deleteMarkTries {
			return rec, err
		}
	}
}

// deleteQuarantined deletes an id without a record: a quarantined record
// and its artifacts go at once (deleting it is the operator's decision),
// otherwise what a crashed publish left is reclaimed as usual.
func (r *Repo) deleteQuarantined(ctx context.Context, id string) error {
	q, err := r.exists(ctx, r.keys.quarantinedRecord(id))
	if err != nil {
		return err
	}
	if !q {
		return r.deleteUnrecorded(ctx, id)
	}
	if err := r.checkNoDependents(ctx, id); err != nil {
		return err
	}
	if err := r.releaseBindingsOf(ctx, id); err != nil {
		return err
	}
	if err := r.remove(ctx, r.keys.quarantinedRecord(id)); err != nil {
		return err
	}
	return r.removeArtifacts(ctx, id)
}

// deleteUnrecorded deletes an id that has neither a record nor a
// quarantined one. Its tombstone says a delete removed its record and
// stopped (a crash, a lost connection, or another node's delete racing
// this one): that delete is finished, its bindings released whatever
// their age, since no publish of a deleted id is in progress. Without a
// tombstone it is what a crashed publish left, reclaimed as usual: a
// young binding or id may be a publish's still running.
func (r *Repo) deleteUnrecorded(ctx context.Context, id string) error {
	deleted, err := r.exists(ctx, r.keys.tombstone(id))
	if err != nil {
		return err
	}
	if deleted {
		if err := r.releaseBindingsOf(ctx, id); err != nil {
			return err
		}
		return r.removeArtifacts(ctx, id)
	}
	if err := r.releaseDanglingBindingsOf(ctx, id); err != nil {
		return err
	}
	return r.reclaimAbandoned(ctx, id)
}

// Sweep moves damaged records and aliases to the quarantine
// (quarantine.go) and reclaims the artifacts that crashed publishes left
// under the prefix: those of ids without a record whose publisher has
// shown no sign of life for the abandoned grace (leftovers.go). Run it
// now and then on one node; it is safe to run concurrently with
// everything else. (Alias bindings released by failed publishes stay:
// deleting one could race with a publisher taking it over, and the next
// publisher of the alias reuses the object.) A snapshot it cannot read
// or clean up keeps what it has and is named in the IncompleteError it
// returns once it has gone through the others (failures.go).
func (r *Repo) Sweep(ctx context.Context) error {
	if err := r.writable(); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	var fail failures
	if err := r.quarantineDamaged(ctx, &fail); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	if err := r.sweepLeases(ctx, &fail); err != nil {
		return fmt.Errorf("sweep leases: %w", err)
	}
	objs, err := r.list(ctx, r.keys.prefix+artifactsDir)
	if err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	seen := map[string]bool{}
	for _, o := range objs {
		id, ok := r.keys.idFromArtifactsKey(o.Key)
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		if err := r.sweepOne(ctx, id); err != nil {
			if err := fail.add(ctx, id, "sweep", err); err != nil {
				return fmt.Errorf("sweep %s: %w", id, err)
			}
		}
	}
	if err := fail.err(); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	return nil
}

func (r *Repo) sweepOne(ctx context.Context, id string) error {
	// A publish in progress here holds the id's lock until it returns;
	// it is nobody's leftover.
	if r.leaseLive(id) {
		return nil
	}
	unlock := r.locks.lock(id)
	defer unlock()
	_, _, err := r.getRecord(ctx, id)
	switch {
	case errors.Is(err, repository.ErrNotFound):
		// A quarantined record keeps its artifacts until its id is deleted.
		if q, err := r.exists(ctx, r.keys.quarantinedRecord(id)); err != nil || q {
			return err
		}
		return r.reclaimAbandoned(ctx, id)
	case errors.Is(err, repository.ErrIntegrity):
		return nil // a record, if a broken one: Delete's to decide
	}
	return err
}

// idOlderThan reports whether the UUIDv7 id was made more than d ago.
func idOlderThan(id string, d time.Duration) bool {
	t, err := idTime(id)
	return err == nil && time.Since(t) > d
}

// Resolve implements repository.Repository.
func (r *Repo) Resolve(ctx context.Context, id string) (repository.Resolved, error) {
	rec, err := r.Get(ctx, id)
	if err != nil {
		return repository.Resolved{}, fmt.Errorf("resolve: %w", err)
	}
	if err := r.openLocal(); err != nil {
		return repository.Resolved{}, fmt.Errorf("resolve %s: node cache: %w", id, err)
	}
	res, err := r.resolve(ctx, rec)
	if err != nil {
		return repository.Resolved{}, fmt.Errorf("resolve %s: %w", id, err)
	}
	return res, nil
}

func (r *Repo) resolve(ctx context.Context, rec repository.Record) (repository.Resolved, error) {
	id := rec.ID
	var mem *memorySource
	var chain *repository.ChainSource
	var err error
	if rec.Layered() {
		chain, err = r.chainOf(ctx, rec)
	} else {
		mem, err = r.memoryOf(ctx, rec)
	}
	if err != nil {
		return repository.Resolved{}, err
	}
	vmPath, err := r.resolveVMState(ctx, rec)
	if err != nil {
		return repository.Resolved{}, err
	}
	res := repository.Resolved{Record: rec, VMStatePath: vmPath}
	if err := r.resolveAttachments(ctx, rec, &res); err != nil {
		return repository.Resolved{}, err
	}
	if chain != nil {
		// Each layer reads the startup pages it owns from the chain's
		// pack (chainpack.go), the others from its chunks.
		if ps := r.streamedPack(ctx, rec, func() string { return res.ManifestPath }, func(error) {}); ps != nil {
			chain.Remote = newChainRemote(r, chain, ps)
		}
		res.Memory = chain
		return res, nil
	}
	res.Memory = mem
	if r.beforeResolveDigests != nil {
		r.beforeResolveDigests(id)
	}
	// A table that is missing or does not match fails the restore's
	// check of it, which names what is wrong.
	if d := rec.MemoryDigests; d != nil {
		if res.DigestsPath, err = r.fetchForCheck(ctx, r.keys.artifact(id, repository.DigestsFileName), d.SHA256, d.Size); err != nil {
			return repository.Resolved{}, err
		}
	}
	if d := rec.MemorySHA256Digests; d != nil {
		if res.SHA256DigestsPath, err = r.fetchForCheck(ctx, r.keys.artifact(id, repository.SHA256DigestsFileName), d.SHA256, d.Size); err != nil {
			return repository.Resolved{}, err
		}
	}
	mem.pack = r.streamedPack(ctx, rec, func() string { return res.ManifestPath }, mem.packSkipped.note)
	r.checkPackPages(rec, mem.pack, res.SHA256DigestsPath)
	return res, nil
}

// resolveVMState fetches rec's VM state into the node cache.
func (r *Repo) resolveVMState(ctx context.Context, rec repository.Record) (string, error) {
	vmPath, err := r.fetchLocal(ctx, r.keys.artifact(rec.ID, repository.VMStateFileName), rec.VMStateSHA256, rec.VMStateSize)
	if errors.Is(err, os.ErrNotExist) {
		if _, _, gerr := r.getRecord(ctx, rec.ID); errors.Is(gerr, repository.ErrNotFound) {
			return "", gerr
		}
		return "", &repository.IntegrityError{Artifact: repository.VMStateFileName,
			Want: fmt.Sprintf("%d bytes", rec.VMStateSize), Got: "no object"}
	}
	if err != nil {
		return "", err
	}
	if filepath.Base(vmPath) != rec.VMStateSHA256 {
		return "", &repository.IntegrityError{Artifact: repository.VMStateFileName, Want: rec.VMStateSHA256, Got: filepath.Base(vmPath)}
	}
	return vmPath, nil
}

// resolveAttachments fetches rec's manifest and refinement for the
// restore's checks: one it cannot use means on-demand reads, or the
// recorded manifest.
func (r *Repo) resolveAttachments(ctx context.Context, rec repository.Record, res *repository.Resolved) error {
	var err error
	if m := rec.Manifest; m != nil {
		if res.ManifestPath, err = r.fetchForCheck(ctx, r.keys.artifact(rec.ID, repository.ManifestFileName), m.SHA256, m.Size); err != nil {
			return err
		}
	}
	if d := rec.Refinement; d != nil {
		if res.RefinementPath, err = r.fetchForCheck(ctx, r.keys.artifact(rec.ID, repository.RefinementFileName(d.SHA256)), d.SHA256, d.Size); err != nil {
			return err
		}
	}
	return nil
}

// streamedPack is the startup pack a restore of rec streams: the refined
// pack when the snapshot has one (a restore with refine on, the default,
// prefetches the refinement), else the recorded manifest's, mapped with
// the manifest at the path manifestPath returns ("" for none; asked only
// then). skipped is told why a pack was passed over. Without a usable pack
// a restore still prefetches, from the chunks, and says why
// (StartupPackSkipped).
func (r *Repo) streamedPack(ctx context.Context, rec repository.Record, manifestPath func() string, skipped func(error)) *packSource {
	if rec.Refinement != nil && rec.RefinedPack != nil {
		ps, err := r.loadRefinedPack(ctx, rec)
		if err == nil {
			return ps
		}
		skipped(fmt.Errorf("refined startup pack not loaded, streaming the recorded one: %w", err))
	}
	if rec.StartupPack == nil {
		return nil
	}
	path := manifestPath()
	if path == "" {
		return nil
	}
	ps, err := r.loadPack(ctx, rec, path)
	if err != nil {
		skipped(fmt.Errorf("startup pack not loaded: %w", err))
		return nil
	}
	return ps
}
