package s3

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/chunkcache"
	"warmstart/internal/integrity"
	"warmstart/internal/layers"
	"warmstart/internal/repository"
)

// Layered memory in the bucket: a child's own layer goes through the chunk
// store as a memory file does (its chunks content-addressed and shared,
// its chunk map artifacts/<id>/layer-<h>.chunks, its tables and page map
// beside it); its ancestors' layers stay with their owners. The child
// registers at every owner first (dependents.go) and its record, written
// last with If-None-Match, is the single visibility point.

// PublishLayer implements repository.Layers.
func (r *Repo) PublishLayer(ctx context.Context, lz repository.Lease, req repository.LayerPublishRequest) (repository.Record, error) {
	if err := r.writable(); err != nil {
		return repository.Record{}, fmt.Errorf("publish layer: %w", err)
	}
	return repository.PublishUnderLease(r, lz, func(id string) (repository.Record, error) { return r.publishLayer(ctx, id, req) })
}

func (r *Repo) publishLayer(ctx context.Context, id string, req repository.LayerPublishRequest) (repository.Record, error) {
	c, err := repository.CheckLayerPublish(id, req)
	if err != nil {
		return repository.Record{}, err
	}
	fault := func(point string) func() { return func() { r.fault(point) } }
	return r.publishWith(ctx, id, req.Alias, publishSteps{
		store: func() (repository.Record, error) {
			if err := r.register(ctx, id, c.Owners, c.Inherited); err != nil {
				return repository.Record{}, err
			}
			r.fault(FaultLayerAfterMarkers)
			return r.storeLayerArtifacts(ctx, id, req, c)
		},
		undo:         func(cctx context.Context) { r.unregister(cctx, id, c.Owners) },
		afterStore:   fault(FaultLayerAfterArtifacts),
		beforeRecord: fault(FaultLayerBeforeRecord),
		afterRecord:  fault(FaultLayerAfterRecord),
	})
}

// Steps of a layer publish at which the crash tests stop the publishing
// process (layerFault).
const (
	FaultLayerAfterMarkers   = "layer.after-markers"
	FaultLayerAfterVMState   = "layer.after-vmstate"
	FaultLayerAfterData      = "layer.after-data"
	FaultLayerAfterArtifacts = "layer.after-artifacts"
	FaultLayerBeforeRecord   = "layer.before-record"
	FaultLayerAfterRecord    = "layer.after-record"
)

// Steps of a ReplaceMemory (flatten): after it found no dependents and
// before it stores anything, and after it stored the new memory and
// before the record naming it.
const (
	FaultReplaceAfterCheck   = "replace.after-check"
	FaultReplaceBeforeRecord = "replace.before-record"
)

// LayerFaultPoints lists them in order.
var LayerFaultPoints = []string{FaultLayerAfterMarkers, FaultLayerAfterVMState, FaultLayerAfterData,
	FaultLayerAfterArtifacts, FaultLayerBeforeRecord, FaultLayerAfterRecord}

func (r *Repo) fault(point string) {
	if r.layerFault != nil {
		r.layerFault(point)
	}
}

// storeLayerArtifacts uploads the VM state, the child's own layer, its
// manifest and its startup pack (chainpack.go) and returns the (signed) record describing them.
func (r *Repo) storeLayerArtifacts(ctx context.Context, id string, req repository.LayerPublishRequest, c repository.CheckedLayerPublish) (repository.Record, error) {
	vm, err := r.upload(ctx, id, repository.VMStateFileName, req.VMStatePath, c.VMStateSize, nil, req.Progress)
	if err != nil {
		return repository.Record{}, err
	}
	r.fault(FaultLayerAfterVMState)
	var own *repository.LayerDescriptor
	if req.Layer != nil {
		d, err := r.storeLayer(ctx, id, req.Layer, req.Progress)
		if err != nil {
			return repository.Record{}, err
		}
		own = &d
	}
	r.fault(FaultLayerAfterData)
	if len(req.Manifest) > 0 {
		if _, err := r.putSmall(ctx, r.keys.artifact(id, repository.ManifestFileName), req.Manifest, putCondition{}); err != nil {
			return repository.Record{}, err
		}
	}
	rec := repository.NewLayerRecord(id, req, c, vm.stored(), own)
	if len(req.Manifest) > 0 {
		// Without a pack a cold node is slower, still correct: a failed
		// build does not fail the publish.
		if pack, err := r.buildChainPack(ctx, rec, req.Parent, req.Layer, req.Manifest); err == nil {
			rec.StartupPack = pack
		}
	}
	return repository.SignRecord(rec, r.opts.SigningKey)
}

// storeLayer uploads a built layer: its data as chunks (an empty layer,
// whose differing pages are all zero, as an empty raw object), its
// tables, its page map; the data's SHA-256 is checked against the
// builder's.
func (r *Repo) storeLayer(ctx context.Context, id string, b *layers.Built, progress func(repository.ImportProgress)) (repository.LayerDescriptor, error) {
	name := b.Name()
	path := b.Path(layers.DataFileName)
	var d repository.LayerDescriptor
	if b.Size == 0 {
		t := integrity.NewTables(0)
		up, err := r.upload(ctx, id, repository.LayerDataFile(name), path, 0, t, progress)
		if err != nil {
			return d, err
		}
		tables := repository.EncodeTables(t)
		if err := r.putTables(ctx, id, name, tables); err != nil {
			return d, err
		}
		d = repository.OwnLayer(id, b, repository.LayerRaw, nil, tables)
		d.SHA256 = up.sha256
	} else {
		mem, err := r.storeMemory(ctx, id, name, path, b.Size, progress)
		if err != nil {
			return d, err
		}
		if mem.uploaded.sha256 != b.SHA256 {
			return d, &repository.IntegrityError{Artifact: repository.LayerDataFile(name), Want: b.SHA256, Got: mem.uploaded.sha256}
		}
		chunks := &repository.ChunkMapDescriptor{SHA256: sha256Hex(mem.chunkMap), Size: int64(len(mem.chunkMap)),
			ChunkBytes: mem.chunks.ChunkBytes, StoredBytes: mem.chunks.StoredBytes()}
		d = repository.OwnLayer(id, b, repository.LayerChunks, chunks, mem.tables)
	}
	if d.SHA256 != b.SHA256 {
		return d, &repository.IntegrityError{Artifact: repository.LayerDataFile(name), Want: b.SHA256, Got: d.SHA256}
	}
	if _, err := r.putSmall(ctx, r.keys.artifact(id, repository.LayerPageMapFile(name)), b.Map.Encode(), putCondition{}); err != nil {
		return d, err
	}
	return d, nil
}

// putTables stores a layer's two digest tables.
func (r *Repo) putTables(ctx context.Context, id, name string, t repository.DigestTables) error {
	for file, table := range map[string][]byte{repository.LayerDigestsFile(name): t.CRC, repository.LayerSHA256DigestsFile(name): t.SHA256} {
		if _, err := r.putSmall(ctx, r.keys.artifact(id, file), table, putCondition{}); err != nil {
			return err
		}
	}
	return nil
}

// chainOf resolves every layer of a layered record: its page map (checked
// against its descriptor), its tables fetched for the restore's check, and
// its data served through the chunk cache, keyed by the layer's SHA-256
// (the base's is its owner's MemorySHA256, so every chain over a base
// shares its cached blocks).
func (r *Repo) chainOf(ctx context.Context, rec repository.Record) (*repository.ChainSource, error) {
	ls, err := r.resolvedLayers(ctx, rec, nil)
	if err != nil {
		return nil, err
	}
	return repository.NewChainSource(rec, ls)
}

// resolvedLayers resolves every layer of rec, the layer own (when not
// nil: a publish's, not in the store yet) from its local build.
func (r *Repo) resolvedLayers(ctx context.Context, rec repository.Record, own *layers.Built) ([]repository.ResolvedLayer, error) {
	ls := make([]repository.ResolvedLayer, len(rec.MemoryLayers))
	for i, d := range rec.MemoryLayers {
		if own != nil && d.Snapshot == rec.ID && d.Name == own.Name() {
			ls[i] = ownLayer(d, own)
			continue
		}
		l, err := r.resolveLayer(ctx, rec, d)
		if err != nil {
			return nil, fmt.Errorf("memory layer %d (of snapshot %s): %w", i, d.Snapshot, err)
		}
		ls[i] = l
	}
	return ls, nil
}

func (r *Repo) resolveLayer(ctx context.Context, rec repository.Record, d repository.LayerDescriptor) (repository.ResolvedLayer, error) {
	l := repository.ResolvedLayer{Descriptor: d}
	var err error
	if l.DigestsPath, err = r.fetchForCheck(ctx, r.keys.artifact(d.Snapshot, repository.LayerDigestsFile(d.Name)), d.Digests.SHA256, d.Digests.Size); err != nil {
		return l, err
	}
	if l.SHA256DigestsPath, err = r.fetchForCheck(ctx, r.keys.artifact(d.Snapshot, repository.LayerSHA256DigestsFile(d.Name)), d.SHA256Digests.SHA256, d.SHA256Digests.Size); err != nil {
		return l, err
	}
	if d.PageMap != nil {
		if l.PageMap, err = r.layerPageMap(ctx, rec, d); err != nil {
			return l, err
		}
	}
	if d.Size == 0 {
		l.Data = repository.EmptyLayerData()
		return l, nil
	}
	src, err := r.layerData(ctx, rec, d)
	if err != nil {
		return l, err
	}
	l.Data = src
	return l, nil
}

// layerPageMap fetches and checks a diff layer's page map.
func (r *Repo) layerPageMap(ctx context.Context, rec repository.Record, d repository.LayerDescriptor) (*layers.PageMap, error) {
	name := repository.LayerPageMapFile(d.Name)
	p, err := r.fetchLocal(ctx, r.keys.artifact(d.Snapshot, name), d.PageMap.SHA256, d.PageMap.Size)
	if errors.Is(err, os.ErrNotExist) {
		return nil, r.goneOr(ctx, rec.ID, &repository.IntegrityError{Artifact: name, Want: fmt.Sprint(d.PageMap.Size, " bytes"), Got: "no object"})
	}
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("read page map: %w", err)
	}
	return repository.DecodeLayerPageMap(d, data)
}

// layerData is the source of one layer's data: chunked through the chunk
// cache, or a raw object (a base stored before memory was chunked, an
// empty layer).
func (r *Repo) layerData(ctx context.Context, rec repository.Record, d repository.LayerDescriptor) (*memorySource, error) {
	owner := repository.Record{ID: d.Snapshot, MemorySize: d.Size, MemorySHA256: d.SHA256, MemoryChunks: d.Chunks}
	if d.Format == repository.LayerChunks {
		m, err := r.chunkMapOf(ctx, owner, layerChunkMapName(d.Name))
		if err != nil {
			return nil, r.goneOr(ctx, rec.ID, err)
		}
		obj := chunkcache.Object{ID: d.SHA256, Size: d.Size, Fetch: r.chunkedFetch(m)}
		return &memorySource{r: r, obj: obj, chunkBytes: m.ChunkBytes}, nil
	}
	src, err := r.rawObject(ctx, owner, repository.LayerDataFile(d.Name))
	if err != nil {
		return nil, r.goneOr(ctx, rec.ID, err)
	}
	return src, nil
}

// ReplaceMemory implements repository.Layers: with no dependents and the
// record's memory still what the flatten read, the new memory is uploaded
// under new names, the record rewritten with If-Match (signed anew), and
// only then the retired layer's chunk map copied to a tombstone (restores
// in flight keep its chunks for the chunk grace) and its objects removed.
func (r *Repo) ReplaceMemory(ctx context.Context, lz repository.Lease, req repository.ReplaceMemoryRequest) (repository.Record, error) {
	if err := r.writable(); err != nil {
		return repository.Record{}, fmt.Errorf("replace memory: %w", err)
	}
	return repository.ReplaceUnderLease(r, lz, func(id string) (repository.Record, error) { return r.replaceMemory(ctx, id, req) })
}

func (r *Repo) replaceMemory(ctx context.Context, id string, req repository.ReplaceMemoryRequest) (repository.Record, error) {
	unlock := r.locks.lock(id)
	defer unlock()
	cur, etag, err := r.getRecord(ctx, id)
	if err != nil {
		return repository.Record{}, err
	}
	if err := repository.CheckReplaceMemory(cur, req, r.opts.SigningKey != nil); err != nil {
		return repository.Record{}, err
	}
	if err := r.checkNoDependents(ctx, id); err != nil {
		return repository.Record{}, err
	}
	r.fault(FaultReplaceAfterCheck)
	next, err := r.storeReplacement(ctx, id, cur, req)
	if err == nil {
		next, err = repository.SignRecord(next, r.opts.SigningKey)
	}
	if err == nil {
		r.fault(FaultReplaceBeforeRecord)
		err = r.writeReplacement(ctx, cur, next, etag)
	}
	if err != nil {
		r.removeUnnamed(ctx, id, req)
		return repository.Record{}, err
	}
	_ = r.remove(ctx, r.keys.artifact(id, journalName))
	if old := repository.RetiredLayer(cur, next); old != nil && r.noDependentsSince(ctx, id) {
		_ = r.retireLayer(ctx, id, old.Name) // what stays, a collection retires (reclaimRetiredLayers)
	}
	r.unregister(ctx, id, repository.DroppedOwners(cur, next))
	return next, nil
}

// writeReplacement writes next over cur (whose ETag is etag) under the
// flatten's lease, as a publish writes its record (writeUnderLease): a
// flatten silent for the abandoned grace looks dead to a collector, which
// then revokes its lease and may retire the layer the flatten stored
// (reclaimRetiredLayers), so a flatten whose lease was revoked writes no
// record, and one whose record landed late puts cur back.
func (r *Repo) writeReplacement(ctx context.Context, cur, next repository.Record, etag string) error {
	var written string
	err := r.writeUnderLease(ctx, cur.ID, func() error {
		var err error
		written, err = r.putRecord(ctx, next, putCondition{ifMatch: etag})
		if err != nil {
			// A write whose answer was lost may have landed (the client's
			// retry then finds the record changed): it is ours if it
			// names our memory.
			if got, tag, gerr := r.getRecord(ctx, cur.ID); gerr == nil && got.MemoryIdentity() == next.MemoryIdentity() {
				written, err = tag, nil
			}
		}
		if errors.Is(err, errPrecondition) {
			return fmt.Errorf("%w: the record changed while the flatten stored its memory", repository.ErrStale)
		}
		return err
	}, func(cctx context.Context) error {
		_, err := r.putRecord(cctx, cur, putCondition{ifMatch: written})
		return err
	})
	if errors.Is(err, repository.ErrLeaseEnded) && !errors.Is(err, errRecordMayStand) {
		return fmt.Errorf("the flatten went unheard for over %v, so snapshot gc took it for dead and may have "+
			"reclaimed the memory it stored; the snapshot keeps its memory as before, flatten it again: %w", r.abandonedGrace, err)
	}
	return err
}

// noDependentsSince reports whether id still has no dependent after its
// new record was written. A child that placed its marker before then may
// have read the old record and name the layer the flatten retires
// (a child that reads the new one refuses it): that layer is then kept,
// until a collection finds that nothing names it (reclaimRetiredLayers).
func (r *Repo) noDependentsSince(ctx context.Context, id string) bool {
	live, inProgress, _, err := r.classifyMarkers(ctx, id)
	return err == nil && len(live) == 0 && len(inProgress) == 0
}

// storeReplacement uploads the new memory and returns the record naming
// it.
func (r *Repo) storeReplacement(ctx context.Context, id string, cur repository.Record, req repository.ReplaceMemoryRequest) (repository.Record, error) {
	if req.Layer != nil {
		own, err := r.storeLayer(ctx, id, req.Layer, req.Progress)
		if err != nil {
			return repository.Record{}, err
		}
		return repository.ReplacedByLayer(cur, own), nil
	}
	mem, err := r.storeMemory(ctx, id, repository.BaseLayerName, req.MemoryPath, cur.MemorySize, req.Progress)
	if err != nil {
		return repository.Record{}, err
	}
	chunks := &repository.ChunkMapDescriptor{SHA256: sha256Hex(mem.chunkMap), Size: int64(len(mem.chunkMap)),
		ChunkBytes: mem.chunks.ChunkBytes, StoredBytes: mem.chunks.StoredBytes()}
	return repository.ReplacedByMemory(cur, mem.uploaded.stored(), mem.tables, repository.MemoryFormatChunks, chunks), nil
}

// removeUnnamed removes what a failed replacement of id stored: the
// layer req names (its new memory) unless id's record names it, retired
// as a collection retires a layer (its chunk map copied to a tombstone
// first: a late record may have named it for a moment,
// writeReplacement), and the journal. Other layers the record does not
// name, such as one an earlier flatten kept for a dependent, stay for
// snapshot gc to retire once nothing can read them
// (reclaimRetiredLayers). Best effort: what is left, a collection
// retires.
func (r *Repo) removeUnnamed(ctx context.Context, id string, req repository.ReplaceMemoryRequest) {
	name := repository.BaseLayerName
	if req.Layer != nil {
		name = req.Layer.Name()
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	// The record read now, not the one the flatten began with: a record
	// write that failed, or a take-back that did, may have left the new
	// memory named. Unread, it stays too.
	rec, _, err := r.getRecord(cctx, id)
	if err != nil {
		return
	}
	for _, l := range rec.Layers() {
		if l.Snapshot == id && l.Name == name {
			return
		}
	}
	// A layer's name is its content's (layers.LayerName): another node's
	// flatten of id stores the same objects, and the same journal, and its
	// record may name them next. While it may be alive they stay; snapshot
	// gc retires them once it is not (reclaimRetiredOf).
	if others, err := r.othersLeaseAlive(cctx, id); err != nil || others {
		return
	}
	_ = r.retireLayer(cctx, id, name)
	_ = r.remove(cctx, r.keys.artifact(id, journalName))
}

// othersLeaseAlive reports whether a lease object on id that this process
// does not hold was written within the abandoned grace: its holder may
// still be storing or publishing under it.
func (r *Repo) othersLeaseAlive(ctx context.Context, id string) (bool, error) {
	objs, err := r.list(ctx, r.keys.leasesOf(id))
	if err != nil {
		return false, err
	}
	own := map[string]bool{}
	r.leaseMu.Lock()
	for _, h := range r.liveLeases[id] {
		own[h.key] = true
	}
	r.leaseMu.Unlock()
	for _, o := range objs {
		if !own[o.Key] && time.Since(o.LastModified) <= r.abandonedGrace {
			return true, nil
		}
	}
	return false, nil
}

// layerFiles are the object names of the layer named name.
func layerFiles(name string) []string {
	return []string{repository.LayerDataFile(name), layerChunkMapName(name), repository.LayerPageMapFile(name),
		repository.LayerDigestsFile(name), repository.LayerSHA256DigestsFile(name)}
}

// retireLayer keeps a replaced layer's chunks for the chunk grace (its
// chunk map copied to a tombstone) and removes its objects; past the
// tombstone, objects left are named by no record and the next collection
// retires them again.
func (r *Repo) retireLayer(ctx context.Context, id, name string) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := r.copyObject(cctx, r.keys.artifact(id, layerChunkMapName(name)), r.keys.layerTombstone(id, name)); err != nil {
		return fmt.Errorf("retire layer %s of %s: %w", name, id, err)
	}
	for _, f := range layerFiles(name) {
		if err := r.remove(cctx, r.keys.artifact(id, f)); err != nil {
			return fmt.Errorf("retire layer %s of %s: %w", name, id, err)
		}
	}
	return nil
}

// A layer a flatten retired stays while a child that read the replaced
// record may name it (noDependentsSince), and so do the objects of a
// retirement that did not finish. A collection reclaims them once
// nothing can read them any more (reclaimRetiredLayers): a layer of
// snapshot id whose objects are under artifacts/<id>/ goes when
//
//   - no lease on id is held here, and no lease object of id was written
//     within the abandoned grace: a flatten in progress holds one from
//     before it uploads its new layer until after its record names it.
//     Only its silence for that long (what the sweep of an abandoned
//     publish waits for too, leftovers.go) tells it dead: its lease
//     object expires by the TTL for a collector whose clock runs ahead,
//     or while a live flattener's renewals fail;
//   - every such lease object could be revoked and removed (endLeases):
//     a flattener that wrote it meanwhile lives, and one whose lease is
//     revoked writes no record, since it confirms its lease right before
//     (writeReplacement, as a publish does: leftovers.go). So a layer
//     listed before that check and named by no record read after the
//     revocation is no flatten's;
//   - id's record, read then (and once before, to skip the lease check
//     for the many snapshots without such a layer), does not name it (a
//     snapshot without a record is a publish's, which the sweep reclaims,
//     or a delete's);
//   - no dependent of id may name it: every marker at id, read after the
//     record, is a child whose record names none of id's layers or only
//     others. A child that registers later reads that record or a newer
//     one, and a child naming a layer its owner no longer holds is
//     refused (CheckOwnerHolds). A marker of a publish in progress, of a
//     quarantined or undecodable record, or of a child without a record
//     (a publish that may still commit; the collection removes the
//     markers of dead ones first, sweepStaleMarkers) keeps every layer.
//
// It is retired as a flatten retires it: its chunk map copied to a
// tombstone first, so that a restore that read an older record (of id or
// of a deleted child) keeps its chunks for the chunk grace. The same
// goes for the objects of a whole memory file (memory.*) id's record
// does not name (a whole flatten that died before its record), and for
// the journal of id: once id has a record, only a flatten in progress
// still needs one, and under the checks above none is; left, a dead
// flatten's would keep the chunks it names for ever.

// reclaimRetiredLayers retires the layers named by no record or
// dependent among those artifacts lists (every object under artifacts/)
// and returns how many. A snapshot whose state it cannot read, or whose
// layers it cannot retire, is one of fail's; the others are reclaimed.
func (r *Repo) reclaimRetiredLayers(ctx context.Context, artifacts []minio.ObjectInfo, fail *failures) (int, error) {
	byID := map[string]map[string]bool{}
	for _, o := range artifacts {
		id, file, ok := strings.Cut(strings.TrimPrefix(o.Key, r.keys.prefix+artifactsDir), "/")
		name, _, dotted := strings.Cut(file, ".")
		layer := strings.HasPrefix(name, "layer-") || name == repository.BaseLayerName
		if !ok || !dotted || !layer || repository.ValidateID(id) != nil {
			continue
		}
		if file == journalName {
			name = journalName // no layer's: it goes with them (see above)
		}
		if byID[id] == nil {
			byID[id] = map[string]bool{}
		}
		byID[id][name] = true
	}
	n := 0
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		retired, err := r.reclaimRetiredOf(ctx, id, byID[id])
		n += retired
		if err != nil {
			if err := fail.add(ctx, id, "retire the layers no record names", err); err != nil {
				return n, fmt.Errorf("retired layers of %s: %w", id, err)
			}
		}
	}
	return n, nil
}

// dropNamed removes from names the layers id's record names, and every
// name when id has no record that decodes (a publish's, whose objects the
// sweep reclaims, or a quarantined or deleted snapshot's).
func (r *Repo) dropNamed(ctx context.Context, id string, names map[string]bool) error {
	rec, _, err := r.getRecord(ctx, id)
	if err != nil {
		clear(names)
		return ignoreMissing(err)
	}
	for _, l := range rec.Layers() {
		if l.Snapshot == id {
			delete(names, l.Name)
		}
	}
	return nil
}

// silentLeases returns id's lease objects and whether they are silent:
// no lease on id is held here and none of them was written within the
// abandoned grace (see above).
func (r *Repo) silentLeases(ctx context.Context, id string) ([]minio.ObjectInfo, bool, error) {
	if r.leaseLive(id) {
		return nil, false, nil
	}
	objs, err := r.list(ctx, r.keys.leasesOf(id))
	if err != nil {
		return nil, false, err
	}
	for _, o := range objs {
		if time.Since(o.LastModified) <= r.abandonedGrace {
			return nil, false, nil
		}
	}
	return objs, true, nil
}

// reclaimRetiredOf retires those of id's layers names (found in its
// artifacts) that nothing can read any more (see above).
func (r *Repo) reclaimRetiredOf(ctx context.Context, id string, names map[string]bool) (int, error) {
	// A publish or flatten in progress here holds id's lock until it
	// returns (a publish waits for this collection meanwhile): it is
	// nobody's leftover.
	if r.leaseLive(id) {
		return 0, nil
	}
	unlock := r.locks.lock(id)
	defer unlock()
	// Most snapshots have no such layer: their record says so at once.
	if err := r.dropNamed(ctx, id, names); err != nil || len(names) == 0 {
		return 0, err
	}
	leases, silent, err := r.silentLeases(ctx, id)
	if err != nil || !silent {
		return 0, err
	}
	// A flatten silent that long may still be alive: its lease is revoked
	// before the record is read, so that it writes no record naming a
	// layer retired here (writeReplacement).
	if ended, err := r.endLeases(ctx, id, leases); err != nil || !ended {
		return 0, err
	}
	if err := r.dropNamed(ctx, id, names); err != nil || len(names) == 0 {
		return 0, err
	}
	named, mayName, err := r.layersDependentsName(ctx, id)
	if err != nil || mayName {
		return 0, err
	}
	return r.retireAllBut(ctx, id, names, named)
}

// retireAllBut retires id's layers names but those named names, and
// removes its journal if names holds it; it returns how many layers it
// retired.
func (r *Repo) retireAllBut(ctx context.Context, id string, names, named map[string]bool) (int, error) {
	n := 0
	for name := range names {
		if named[name] || name == journalName {
			continue
		}
		if err := r.retireLayer(ctx, id, name); err != nil {
			return n, err
		}
		n++
	}
	if names[journalName] {
		return n, r.remove(ctx, r.keys.artifact(id, journalName))
	}
	return n, nil
}
