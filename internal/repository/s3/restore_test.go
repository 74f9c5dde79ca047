package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/chunkcache"
	"warmstart/internal/chunkmap"
	"warmstart/internal/config"
	"warmstart/internal/lab/reference"
	"warmstart/internal/lab/synth"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/prefetch"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
	"warmstart/internal/restore/restoretest"
	"warmstart/internal/trace"
	"warmstart/internal/vmm/replay"
)

// These tests restore the reference snapshot from MinIO through the chunk
// cache and the FUSE device, with the replay VMM (a separate process)
// faulting guest memory, and compare its hash of what it read with the
// memory file's.

// refMemoryBytes keeps restores fast while spanning many cache blocks.
const refMemoryBytes = 16 << 20

// world is one test's object store endpoint, FUSE mount and restorer.
type world struct {
	endpoint string
	prefix   string
	dir      string
	srv      *fusedev.Server
	restorer *restore.Restorer
	tracing  *restore.Restorer
	// readHook runs in every demand read of a device: in the file
	// device's FUSE read handler before the lower is read, in the uffd
	// device's fault loop once it is.
	readHook atomic.Pointer[func(off int64)]
	// device is the memory device restores run on; the file device when
	// empty.
	device string
}

// deviceKinds are the memory devices the S3 restore tests run on.
var deviceKinds = []string{config.DeviceFile, config.DeviceUffd}

// hookObserver runs the world's read hook for every demand read a device
// served.
type hookObserver struct{ w *world }

func (o hookObserver) Served(kind memdev.Kind, off int64, _ int, _ time.Duration) {
	if h := o.w.readHook.Load(); h != nil && kind == memdev.Demand {
		(*h)(off)
	}
}

// snapshot is a published reference snapshot with its manifest recorded.
type snapshot struct {
	id       string
	paths    synth.Paths
	expected string // the replay VMM's hash when every byte it reads is right
}

func newWorld(t *testing.T, endpoint string) *world {
	t.Helper()
	needServer(t)
	w := &world{endpoint: endpoint, prefix: uniquePrefix(t), dir: t.TempDir()}
	srv, err := fusedev.Mount(filepath.Join(w.dir, "mnt"), fusedev.Options{ReadHook: func(_ uint64, off int64, _ int) {
		if h := w.readHook.Load(); h != nil {
			(*h)(off)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	w.srv = srv
	uffdWatched := restoretest.Watch{Observer: hookObserver{w}}.Devices(memdev.Devices{uffd.NewOpener(0)})
	w.restorer = &restore.Restorer{
		Devices:    memdev.Devices{fusedev.NewOpener(srv, nil), uffdWatched[0]},
		Engine:     prefetch.NewEngine(prefetch.Options{}),
		VMM:        &replay.VMM{},
		RuntimeDir: filepath.Join(w.dir, "run"),
	}
	// The recorder's restorer, as a node assembles it
	// (node.TracingOptions): its own one-page-window mount and engine.
	tracing, err := fusedev.Mount(filepath.Join(w.dir, "recmnt"), fusedev.Options{ReadAheadBytes: recorder.TraceReadAheadBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tracing.Close() })
	w.tracing = &restore.Restorer{
		Devices:    restoretest.Devices(tracing, nil),
		Engine:     prefetch.NewEngine(prefetch.Options{}),
		VMM:        w.restorer.VMM,
		RuntimeDir: w.restorer.RuntimeDir,
	}
	return w
}

// repo opens the world's repository with an empty node cache of maxBytes
// (0: the test default): every call is a node whose cache is cold.
func (w *world) repo(t *testing.T, maxBytes int64) *Repo {
	t.Helper()
	o := testOptions(t, w.endpoint)
	o.Prefix = w.prefix
	if maxBytes > 0 {
		o.CacheMaxBytes = maxBytes
	}
	return openWith(t, o)
}

// publish synthesizes the reference snapshot for seed, publishes it through
// repo and records its startup manifest.
func (w *world) publish(t *testing.T, repo *Repo, seed uint64) snapshot {
	t.Helper()
	refDir := filepath.Join(w.dir, fmt.Sprintf("reference-%d", seed))
	w.tracing.VMM = &replay.VMM{TracePath: synth.PathsIn(refDir).Trace}
	rec := &recorder.Recorder{Repo: repo, Restorer: w.tracing, Device: config.DeviceFile}
	snap, job, err := reference.Publish(bg(), repo, rec, reference.Options{Dir: refDir, MemoryBytes: refMemoryBytes, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := job.Result(); err != nil {
		t.Fatalf("record manifest: %v", err)
	}
	entries, err := trace.ReadFile(snap.Paths.Trace)
	if err != nil {
		t.Fatal(err)
	}
	want, err := replay.ExpectedHash(snap.Paths.Memory, entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	return snapshot{id: snap.ID, paths: snap.Paths, expected: want}
}

// restore resolves snap through repo and restores it with prefetch mode.
func (w *world) restore(t *testing.T, repo *Repo, snap snapshot, mode restore.Mode) (*restore.Instance, error) {
	t.Helper()
	return w.restoreCtx(t, bg(), repo, snap, mode, func() {})
}

// restoreCtx is restore bounded by ctx, as a caller that may give up;
// before runs once snap is resolved, just before the restore starts.
func (w *world) restoreCtx(t *testing.T, ctx context.Context, repo *Repo, snap snapshot, mode restore.Mode, before func()) (*restore.Instance, error) {
	t.Helper()
	res, err := repo.Resolve(bg(), snap.id)
	if err != nil {
		t.Fatal(err)
	}
	if res.Memory == nil || res.MemoryPath != "" {
		t.Fatalf("resolved memory: path %q, source %v; want only a source", res.MemoryPath, res.Memory)
	}
	src := restore.SourceIn(bg(), repo, res) // as a node's restore builds it
	if src.Manifest == nil {
		t.Fatal("snapshot has no manifest")
	}
	w.restorer.VMM = &replay.VMM{TracePath: snap.paths.Trace}
	before()
	return w.restorer.Restore(ctx, src, restore.Options{Device: w.device, Prefetch: mode})
}

// restoreOK restores and checks the guest read exactly the memory file.
func (w *world) restoreOK(t *testing.T, repo *Repo, snap snapshot, mode restore.Mode) *restore.Instance {
	t.Helper()
	inst, err := w.restore(t, repo, snap, mode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Stop(bg()) })
	if got := inst.Ready.Detail.SHA256; got != snap.expected {
		t.Fatalf("prefetch %s: guest read sha256 %s, want %s", mode, got, snap.expected)
	}
	if mode == restore.ModeOn && inst.Prefetch.State == "skipped" {
		t.Fatalf("prefetch on was skipped: %s", inst.Prefetch.Reason)
	}
	return inst
}

func TestRestoreThroughChunkCache(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	snap := w.publish(t, w.repo(t, 0), 7)
	for _, mode := range []restore.Mode{restore.ModeOff, restore.ModeOn} {
		t.Run(string(mode), func(t *testing.T) {
			repo := w.repo(t, 0) // cold node cache
			before := repo.RequestStats()
			inst := w.restoreOK(t, repo, snap, mode)
			if err := inst.Stop(bg()); err != nil {
				t.Fatal(err)
			}
			req, cs := repo.RequestStats().Sub(before), repo.Cache().Stats()
			t.Logf("prefetch %s: ready %v, %d GETs, %.1f MiB, cache %+v", mode, inst.Timings.Ready,
				req.Gets, float64(req.GetBytes)/(1<<20), cs)
			if mode == restore.ModeOn && cs.PrefetchedBlocks == 0 {
				t.Fatal("prefetch on fetched no block into the cache")
			}
			if mode == restore.ModeOff && cs.PrefetchedBlocks != 0 {
				t.Fatalf("prefetch off prefetched %d blocks", cs.PrefetchedBlocks)
			}
			// Whatever the cache holds now reads back as the memory file.
			res, err := repo.Resolve(bg(), snap.id)
			if err != nil {
				t.Fatal(err)
			}
			if got := repotest.ResolvedMemorySHA256(t, res); got != res.Record.MemorySHA256 {
				t.Fatalf("memory through the cache hashes to %s, record says %s", got, res.Record.MemorySHA256)
			}
		})
	}
}

// TestStoreStoppedMidRestore stops MinIO while the guest is faulting its
// memory in: reads of blocks not yet cached fail with EIO, the serving
// process and its mount survive, nothing wrong is served or cached, and
// once MinIO is back the next restore succeeds.
func TestStoreStoppedMidRestore(t *testing.T) {
	for _, device := range deviceKinds {
		t.Run(device, func(t *testing.T) { testStoreStoppedMidRestore(t, device) })
	}
}

func testStoreStoppedMidRestore(t *testing.T, device string) {
	own := ownServer(t)
	w := newWorld(t, own.Endpoint)
	w.device = device
	snap := w.publish(t, w.repo(t, 0), 11)
	repo := w.repo(t, 0) // cold: the restore needs the store

	// Stop the store at the fifth demand read: the reads after it find
	// the store gone.
	var reads atomic.Int64
	stopped := make(chan struct{})
	hook := func(int64) {
		if reads.Add(1) == 5 {
			own.Stop()
			close(stopped)
		}
	}
	w.readHook.Store(&hook)
	_, err := w.restore(t, repo, snap, restore.ModeOff)
	w.readHook.Store(nil)
	if err == nil {
		t.Fatal("restore succeeded with the object store stopped")
	}
	select {
	case <-stopped:
	default:
		t.Fatalf("the store was never stopped: %v", err)
	}
	// The file device answers the failed read with EIO, which the guest
	// takes as a memory fault; the uffd device cannot serve the fault,
	// so its handler stops and the VM with it.
	if !strings.Contains(err.Error(), "memory fault") && !strings.Contains(err.Error(), "page-fault handler stopped") {
		t.Fatalf("restore failed, but not on a memory fault: %v", err)
	}
	// The failure says that memory reads failed and why the first did,
	// which the VMM cannot (the store's way of failing varies: a refused
	// connection, a reset one, a body cut short).
	if !strings.Contains(err.Error(), "memory reads failed on the device") {
		t.Fatalf("restore error does not say that memory reads failed: %v", err)
	}
	t.Logf("restore with the store stopped: %v", err)

	// A read through the device of a block not cached fails with EIO, and
	// the mount keeps serving.
	cs := repo.Cache().Stats()
	if cs.FetchErrors == 0 {
		t.Fatalf("no failed fetch recorded: %+v", cs)
	}
	probe := probeUncached(t, w, repo, snap)
	if !errors.Is(probe, syscall.EIO) {
		t.Fatalf("device read of an uncached block with the store stopped: %v, want EIO", probe)
	}

	if err := own.Start(); err != nil {
		t.Fatal(err)
	}
	waitHoldoffOver(t, repo)
	inst := w.restoreOK(t, repo, snap, restore.ModeOff)
	if err := inst.Stop(bg()); err != nil {
		t.Fatal(err)
	}
	// No wrong byte made it into the cache.
	res, err := repo.Resolve(bg(), snap.id)
	if err != nil {
		t.Fatal(err)
	}
	if got := repotest.ResolvedMemorySHA256(t, res); got != res.Record.MemorySHA256 {
		t.Fatalf("memory through the cache hashes to %s, record says %s", got, res.Record.MemorySHA256)
	}
}

// probeUncached reads, with pread(2) through a FUSE device file of snap's
// memory, a block the node cache does not hold. The store is down, so the
// memory source is built from the snapshot's local files instead of a
// Resolve.
func probeUncached(t *testing.T, w *world, repo *Repo, snap snapshot) error {
	t.Helper()
	rec, err := recordFromLocal(snap)
	if err != nil {
		t.Fatal(err)
	}
	src, err := localChunkedSource(repo, snap.paths.Memory, rec)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := w.srv.Attach("probe-"+snap.id, memdev.Request{Memory: src, IOEngine: memdev.IOEngineBuffered})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Release(context.Background())
	var off int64 = -1
	for b := int64(0); b*repo.Cache().BlockBytes() < rec.MemorySize; b++ {
		if !repo.Cache().Cached(rec.MemorySHA256, b) {
			off = b * repo.Cache().BlockBytes()
			break
		}
	}
	if off < 0 {
		t.Fatal("every block is cached")
	}
	f, err := os.Open(dev.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = f.ReadAt(make([]byte, 4096), off)
	return err
}

// localChunkedSource is the memory source of the chunked memory file at
// path, its chunk map computed locally (no request).
func localChunkedSource(repo *Repo, path string, rec repository.Record) (*memorySource, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := chunkmap.Map{ChunkBytes: repo.chunkBytes, Size: int64(len(data))}
	for off := int64(0); off < m.Size; off += m.ChunkBytes {
		c := data[off:min(off+m.ChunkBytes, m.Size)]
		if chunkmap.IsZero(c) {
			m.Chunks = append(m.Chunks, chunkmap.Chunk{Zero: true})
		} else {
			m.Chunks = append(m.Chunks, chunkmap.Chunk{Digest: chunkmap.Sum(c)})
		}
	}
	obj := chunkcache.Object{ID: rec.MemorySHA256, Size: rec.MemorySize, Fetch: repo.chunkedFetch(m)}
	return &memorySource{r: repo, obj: obj}, nil
}

// recordFromLocal rebuilds the memory part of snap's record from its files.
func recordFromLocal(snap snapshot) (repository.Record, error) {
	data, err := os.ReadFile(snap.paths.Memory)
	if err != nil {
		return repository.Record{}, err
	}
	return repository.Record{ID: snap.id, MemorySize: int64(len(data)), MemorySHA256: sha256Hex(data)}, nil
}

// TestCorruptChunkRefetchedOnRestore damages a cached block on disk between
// two node lifetimes: the restore detects it, discards it, fetches it again
// and the guest reads the right bytes.
// restoredOnce publishes the snapshot of seed and restores it once on a
// node whose repository options it returns: their cache directory then
// holds the blocks the restore read, for a test to damage and reopen.
func (w *world) restoredOnce(t *testing.T, seed uint64) (snapshot, Options) {
	t.Helper()
	snap := w.publish(t, w.repo(t, 0), seed)
	o := testOptions(t, w.endpoint)
	o.Prefix = w.prefix
	first := openWith(t, o)
	inst := w.restoreOK(t, first, snap, restore.ModeOff)
	if err := inst.Stop(bg()); err != nil {
		t.Fatal(err)
	}
	first.Close()
	return snap, o
}

func TestCorruptChunkRefetchedOnRestore(t *testing.T) {
	for _, device := range deviceKinds {
		t.Run(device, func(t *testing.T) { testCorruptChunkRefetchedOnRestore(t, device) })
	}
}

func testCorruptChunkRefetchedOnRestore(t *testing.T, device string) {
	w := newWorld(t, server.Endpoint)
	w.device = device
	snap, o := w.restoredOnce(t, 7)

	files, err := filepath.Glob(filepath.Join(o.CacheDir, "chunks", "*", "*.blk"))
	if err != nil || len(files) < 2 {
		t.Fatalf("cached block files %v (%v)", files, err)
	}
	for i, f := range files {
		if err := os.Chmod(f, 0o644); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			data, _ := os.ReadFile(f)
			data[len(data)/2] ^= 0x5a
			err = os.WriteFile(f, data, 0o644)
		} else {
			err = os.Truncate(f, 100)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	second, gets := w.restoreOnReopenedCache(t, snap, o)
	cs := second.Cache().Stats()
	if cs.Corrupt != uint64(len(files)) {
		t.Fatalf("%d corrupt blocks detected, %d damaged: %+v", cs.Corrupt, len(files), cs)
	}
	if gets == 0 {
		t.Fatal("damaged blocks were not fetched again")
	}
}

// TestCacheBoundUnderRestoreLoop restores three snapshots in turn, with a
// node cache that holds one snapshot's memory and startup pack (16 MiB and
// about 5) but not what they touch together: the cache never holds more
// than its bound, blocks of the snapshot being restored (pinned by its
// device) are never evicted, and every restore reads the right bytes.
func TestCacheBoundUnderRestoreLoop(t *testing.T) {
	const bound = 24 << 20
	w := newWorld(t, server.Endpoint)
	pub := w.repo(t, 0)
	snaps := []snapshot{w.publish(t, pub, 21), w.publish(t, pub, 22), w.publish(t, pub, 23)}
	repo := w.repo(t, bound)
	var fetched uint64
	for round := range 2 {
		for i, snap := range snaps {
			mode := restore.ModeOn
			if (round+i)%2 == 1 {
				mode = restore.ModeOff
			}
			inst := w.restoreOK(t, repo, snap, mode)
			if err := inst.Stop(bg()); err != nil {
				t.Fatal(err)
			}
			cs := repo.Cache().Stats()
			if cs.PeakBytes > bound || cs.UsedBytes > bound {
				t.Fatalf("round %d snapshot %d: cache holds %d bytes (peak %d), bound %d", round, i, cs.UsedBytes, cs.PeakBytes, bound)
			}
			fetched = cs.FetchedBytes
		}
	}
	cs := repo.Cache().Stats()
	if cs.Evictions == 0 || fetched <= bound {
		t.Fatalf("the loop never filled the cache: %+v", cs)
	}
	if cs.Uncached != 0 {
		t.Fatalf("%d blocks went uncached although one snapshot fits: %+v", cs.Uncached, cs)
	}
	t.Logf("6 restores through a %d MiB cache: %.1f MiB fetched, %d evictions, peak %.1f MiB",
		bound>>20, float64(cs.FetchedBytes)/(1<<20), cs.Evictions, float64(cs.PeakBytes)/(1<<20))
}

// A chunk object replaced in the bucket by another snapshot's chunk (valid
// zstd, other bytes) fails its digest check on fetch: the restore fails
// with an integrity error, never serving those bytes, on either device; a
// chunk map replaced by another snapshot's fails Resolve.
func TestReplacedMemoryObjectIsNeverServed(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	publisher := w.repo(t, 0)
	snap := w.publish(t, publisher, 7)
	other := w.publish(t, publisher, 8)
	mine, theirs := chunkMapOf(t, publisher, snap.id), chunkMapOf(t, publisher, other.id)
	for i, c := range mine.Chunks {
		if c.Zero || theirs.Chunks[i].Zero || c.Digest == theirs.Chunks[i].Digest {
			continue
		}
		src := publisher.keys.chunk(theirs.Chunks[i].Digest)
		rewriteObject(t, publisher, publisher.keys.chunk(c.Digest), func([]byte) []byte { return readObject(t, publisher, src) })
	}
	// The startup set comes from the pack; replace it too, so the guest's
	// reads fall back to the chunks.
	mineRec, err := publisher.Get(bg(), snap.id)
	if err != nil {
		t.Fatal(err)
	}
	theirRec, err := publisher.Get(bg(), other.id)
	if err != nil {
		t.Fatal(err)
	}
	if mineRec.StartupPack == nil || theirRec.StartupPack == nil {
		t.Fatal("no startup pack was built")
	}
	myPack, _ := packKeys(publisher.keys, snap.id, mineRec.StartupPack.ManifestSHA256)
	theirPack, _ := packKeys(publisher.keys, other.id, theirRec.StartupPack.ManifestSHA256)
	rewriteObject(t, publisher, myPack, func([]byte) []byte { return readObject(t, publisher, theirPack) })
	for _, device := range deviceKinds {
		w.device = device
		for _, mode := range []restore.Mode{restore.ModeOff, restore.ModeOn} {
			counter := &restoretest.IntegrityCounter{}
			w.restorer.Observe = counter
			inst, err := w.restore(t, w.repo(t, 0), snap, mode)
			if err == nil {
				inst.Stop(bg())
				t.Fatalf("%s device, prefetch %s: restore of a snapshot whose chunks were replaced succeeded (guest sha %s, published %s)",
					device, mode, inst.Ready.Detail.SHA256, snap.expected)
			}
			if !strings.Contains(err.Error(), snap.id) || !errors.Is(err, repository.ErrIntegrity) {
				t.Fatalf("%s device, prefetch %s: restore = %v, want an integrity error naming %s", device, mode, err, snap.id)
			}
			if got := counter.Failures(); !slices.Contains(got, restore.ArtifactMemory) {
				t.Fatalf("%s device, prefetch %s: integrity failures counted %v; want memory among them", device, mode, got)
			}
		}
	}
	w.restorer.Observe = nil
	mapKey := publisher.keys.artifact(snap.id, chunkMapName)
	rewriteObject(t, publisher, mapKey, func([]byte) []byte { return readObject(t, publisher, publisher.keys.artifact(other.id, chunkMapName)) })
	if _, err := w.repo(t, 0).Resolve(bg(), snap.id); !errors.Is(err, repository.ErrIntegrity) {
		t.Fatalf("Resolve with another snapshot's chunk map: %v, want ErrIntegrity", err)
	}
}

// chunkMapOf reads and decodes the chunk map of snapshot id.
func chunkMapOf(t *testing.T, r *Repo, id string) chunkmap.Map {
	t.Helper()
	rec, err := r.Get(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	m, err := chunkmap.Decode(readObject(t, r, r.keys.artifact(id, chunkMapName)), rec.MemorySize)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func readObject(t *testing.T, r *Repo, key string) []byte {
	t.Helper()
	body, _, _, err := r.core.GetObject(bg(), r.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	data, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestStartupStreamStartsFirst: on a cold node, a restore with prefetch
// starts streaming the startup pack before it acquires the memory device
// (the wire is a cold node's floor, so it starts first), the stream
// delivers blocks before ready, and the guest reads exactly the memory
// file. Without prefetch nothing streams.
func TestStartupStreamStartsFirst(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	snap := w.publish(t, w.repo(t, 0), 11)

	inst := w.restoreOK(t, w.repo(t, 0), snap, restore.ModeOn)
	tm := inst.Timings
	if tm.StreamStarted <= 0 || tm.StreamStarted > tm.DeviceAcquired {
		t.Fatalf("stream started at %v, device acquired at %v: want the stream first", tm.StreamStarted, tm.DeviceAcquired)
	}
	if tm.StreamFirstBlock <= 0 || tm.StreamFirstBlock > tm.Ready {
		t.Fatalf("first streamed block at %v, ready at %v: want a block before ready", tm.StreamFirstBlock, tm.Ready)
	}

	off := w.restoreOK(t, w.repo(t, 0), snap, restore.ModeOff)
	if off.Timings.StreamStarted != 0 || off.Timings.StreamFirstBlock != 0 {
		t.Fatalf("prefetch off streamed: %+v", off.Timings)
	}
}

// TestCorruptPackFrameIsNeverServed flips a byte in every frame of the
// startup pack: the stream checks each frame before any of its bytes reach
// a reader, so a cold restore with prefetch streams nothing usable, reads
// the startup set from the chunks and the guest reads exactly the memory.
func TestCorruptPackFrameIsNeverServed(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	publisher := w.repo(t, 0)
	snap := w.publish(t, publisher, 9)
	rec, err := publisher.Get(bg(), snap.id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.StartupPack == nil {
		t.Fatal("no startup pack was built")
	}
	packKey, indexKey := packKeys(publisher.keys, snap.id, rec.StartupPack.ManifestSHA256)
	idx, err := chunkmap.DecodePack(readObject(t, publisher, indexKey))
	if err != nil {
		t.Fatal(err)
	}
	if len(idx.Frames) < 2 {
		t.Fatalf("pack of %d frames: too few to stream", len(idx.Frames))
	}
	rewriteObject(t, publisher, packKey, func(data []byte) []byte {
		for _, f := range idx.Frames {
			data[f.Offset+f.StoredBytes/2] ^= 0x5a
		}
		return data
	})
	repo := w.repo(t, 0)
	inst := w.restoreOK(t, repo, snap, restore.ModeOn)
	if err := inst.Stop(bg()); err != nil {
		t.Fatal(err)
	}
	if tm := inst.Timings; tm.StreamStarted <= 0 || tm.StreamFirstBlock != 0 {
		t.Fatalf("stream of a pack whose every frame is corrupt: started %v, first block %v; want started, no block",
			tm.StreamStarted, tm.StreamFirstBlock)
	}
}

// TestUffdRestoresAnS3Snapshot: the uffd device serves remote memory as
// the file device does: through the node cache, every block checked, the
// startup pack streamed before the VMM starts and the startup set
// prefetched; the guest reads exactly the memory file.
func TestUffdRestoresAnS3Snapshot(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	snap := w.publish(t, w.repo(t, 0), 13)
	repo := w.repo(t, 0) // cold node cache
	res, err := repo.Resolve(bg(), snap.id)
	if err != nil {
		t.Fatal(err)
	}
	w.restorer.VMM = &replay.VMM{TracePath: snap.paths.Trace}
	before := repo.RequestStats()
	inst, err := w.restorer.Restore(bg(), restore.SourceIn(bg(), repo, res), restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOn})
	if err != nil {
		t.Fatalf("uffd restore of an S3 snapshot: %v", err)
	}
	defer inst.Stop(bg())
	if got := inst.Ready.Detail.SHA256; got != snap.expected {
		t.Fatalf("guest read sha256 %s, want %s", got, snap.expected)
	}
	if inst.Prefetch.State == "skipped" || inst.Prefetch.StartupPackSkipped != "" {
		t.Fatalf("prefetch %s (%s), pack skipped %q: want the startup set prefetched from the pack",
			inst.Prefetch.State, inst.Prefetch.Reason, inst.Prefetch.StartupPackSkipped)
	}
	if tm := inst.Timings; tm.StreamStarted <= 0 || tm.StreamStarted > tm.DeviceAcquired || tm.StreamFirstBlock <= 0 {
		t.Fatalf("timings %+v: want the startup pack streaming before the device was acquired", tm)
	}
	if gets := repo.RequestStats().Sub(before).Gets; gets == 0 {
		t.Fatal("a cold node restored without a GET")
	}
	if err := inst.Stop(bg()); err != nil {
		t.Fatal(err)
	}
}

// TestMissingChunkOfALiveSnapshotIsAnIntegrityFailure: a chunk object gone
// from the bucket while its snapshot is still published is lost data, not
// a deletion. The restore fails with an integrity error naming the
// snapshot and counts an integrity failure of the memory, as for a chunk
// with other bytes; only a snapshot deleted meanwhile excuses it.
func TestMissingChunkOfALiveSnapshotIsAnIntegrityFailure(t *testing.T) {
	for _, device := range deviceKinds {
		t.Run(device, func(t *testing.T) { testMissingChunkOfALiveSnapshot(t, device) })
	}
}

func testMissingChunkOfALiveSnapshot(t *testing.T, device string) {
	w := newWorld(t, server.Endpoint)
	w.device = device
	publisher := w.repo(t, 0)
	snap := w.publish(t, publisher, 9)
	for _, c := range chunkMapOf(t, publisher, snap.id).Chunks {
		if !c.Zero {
			if err := publisher.remove(bg(), publisher.keys.chunk(c.Digest)); err != nil {
				t.Fatal(err)
			}
		}
	}
	rec, err := publisher.Get(bg(), snap.id)
	if err != nil || rec.StartupPack == nil {
		t.Fatalf("record %+v, %v: want one with a startup pack", rec, err)
	}
	// Without its pack the startup set is read from the chunks too.
	pack, _ := packKeys(publisher.keys, snap.id, rec.StartupPack.ManifestSHA256)
	if err := publisher.remove(bg(), pack); err != nil {
		t.Fatal(err)
	}
	counter := &restoretest.IntegrityCounter{}
	w.restorer.Observe = counter
	defer func() { w.restorer.Observe = nil }()
	inst, err := w.restore(t, w.repo(t, 0), snap, restore.ModeOff)
	if err == nil {
		inst.Stop(bg())
		t.Fatal("restore of a published snapshot whose chunks are gone succeeded")
	}
	if !strings.Contains(err.Error(), snap.id) || !errors.Is(err, repository.ErrIntegrity) {
		t.Fatalf("restore = %v, want an integrity error naming %s", err, snap.id)
	}
	if got := counter.Failures(); !slices.Contains(got, restore.ArtifactMemory) {
		t.Fatalf("integrity failures counted %v; want memory among them", got)
	}
}
