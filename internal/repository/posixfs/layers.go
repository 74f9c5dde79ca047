package posixfs

import (
	"context"
	"errors"
	"fmt"
	"os"

	"warmstart/internal/durable"
	"warmstart/internal/layers"
	"warmstart/internal/repository"
	"warmstart/internal/untrusted"
)

// Layered memory on POSIX: a child's own layer lies in its snapshot
// directory as layer-<h>.bin (the differing non-zero pages), .pagemap,
// .digests and .sha256-digests, all read-only; its ancestors' layers stay
// in their owners' directories. Before anything of the child is stored,
// it registers at every owner (dependents.go), so no owner can be deleted
// under it; the record, written last, is the single visibility point.

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
	if err := r.checkPublishable(id, req.Alias); err != nil {
		return repository.Record{}, err
	}
	published := false
	defer func() {
		if !published {
			_ = r.removeSnapshotDir(id)
			r.unregister(id, c.Owners)
		}
	}()
	if err := r.register(ctx, id, c.Owners, c.Inherited); err != nil {
		return repository.Record{}, err
	}
	r.fault(FaultLayerAfterMarkers)
	dir, err := r.freshSnapshotDir(id)
	if err != nil {
		return repository.Record{}, err
	}
	rec, err := r.storeLayerArtifacts(ctx, id, dir, req, c)
	if err != nil {
		return repository.Record{}, err
	}
	if err := r.commitRecord(ctx, rec); err != nil {
		return repository.Record{}, err
	}
	published = true
	return rec, nil
}

// storeLayerArtifacts imports the VM state, the child's own layer and its
// manifest into dir and returns the (signed) record describing them.
func (r *Repo) storeLayerArtifacts(ctx context.Context, id, dir string, req repository.LayerPublishRequest, c repository.CheckedLayerPublish) (repository.Record, error) {
	vm, err := r.importArtifact(ctx, dir, importSpec{src: req.VMStatePath, name: repository.VMStateFileName,
		size: c.VMStateSize, tempFault: FaultPublishAfterVMStateTemp, link: req.Link}, req.Progress)
	if err != nil {
		return repository.Record{}, err
	}
	var own *repository.LayerDescriptor
	if req.Layer != nil {
		d, err := r.importLayer(ctx, id, dir, req.Layer, req.Link, req.Progress)
		if err != nil {
			return repository.Record{}, err
		}
		own = &d
	}
	if len(req.Manifest) > 0 {
		if err := r.writeFileDurable(dir, repository.ManifestFileName, req.Manifest, artifactFileMode, faultPoints{}); err != nil {
			return repository.Record{}, err
		}
	}
	if err := durable.Sync(dir); err != nil {
		return repository.Record{}, err
	}
	r.fault(FaultLayerAfterArtifacts)
	return repository.SignRecord(repository.NewLayerRecord(id, req, c, vm.stored(), own), r.opts.SigningKey)
}

// importLayer stores a built layer's data (hashed as it is stored, its
// tables built in the same pass and its SHA-256 checked against the
// builder's), page map and tables under the layer's name.
func (r *Repo) importLayer(ctx context.Context, id, dir string, b *layers.Built, link bool, progress func(repository.ImportProgress)) (repository.LayerDescriptor, error) {
	name := b.Name()
	data, err := r.importArtifact(ctx, dir, importSpec{src: b.Path(layers.DataFileName), name: repository.LayerDataFile(name),
		size: b.Size, tempFault: FaultLayerAfterDataTemp, digests: true, link: link}, progress)
	if err != nil {
		return repository.LayerDescriptor{}, err
	}
	if data.sha256 != b.SHA256 {
		return repository.LayerDescriptor{}, &repository.IntegrityError{Artifact: repository.LayerDataFile(name), Want: b.SHA256, Got: data.sha256}
	}
	for file, content := range map[string][]byte{
		repository.LayerPageMapFile(name):       b.Map.Encode(),
		repository.LayerDigestsFile(name):       data.tables.CRC,
		repository.LayerSHA256DigestsFile(name): data.tables.SHA256,
	} {
		if err := r.writeFileDurable(dir, file, content, artifactFileMode, faultPoints{}); err != nil {
			return repository.LayerDescriptor{}, err
		}
	}
	return repository.OwnLayer(id, b, repository.LayerRaw, nil, data.tables), nil
}

// resolveLayers checks that every layer file of rec exists with the size
// its descriptor gives, reads and checks the page maps, and returns the
// chain as a memory source.
func (r *Repo) resolveLayers(rec repository.Record) (*repository.ChainSource, error) {
	var ls []repository.ResolvedLayer
	for i, d := range rec.MemoryLayers {
		l, err := r.resolveLayer(d)
		if err != nil {
			return nil, fmt.Errorf("memory layer %d (of snapshot %s): %w", i, d.Snapshot, err)
		}
		ls = append(ls, l)
	}
	return repository.NewChainSource(rec, ls)
}

// resolveLayer checks one layer's files.
func (r *Repo) resolveLayer(d repository.LayerDescriptor) (repository.ResolvedLayer, error) {
	path := func(name string) string { return r.paths.artifactPath(d.Snapshot, name) }
	l := repository.ResolvedLayer{Descriptor: d, DataPath: path(repository.LayerDataFile(d.Name)),
		DigestsPath: path(repository.LayerDigestsFile(d.Name)), SHA256DigestsPath: path(repository.LayerSHA256DigestsFile(d.Name))}
	checks := []struct {
		path, name string
		size       int64
	}{{l.DataPath, repository.LayerDataFile(d.Name), d.Size}, {l.DigestsPath, repository.LayerDigestsFile(d.Name), d.Digests.Size},
		{l.SHA256DigestsPath, repository.LayerSHA256DigestsFile(d.Name), d.SHA256Digests.Size}}
	for _, c := range checks {
		if err := checkArtifact(c.path, c.name, c.size); err != nil {
			return l, err
		}
	}
	if d.PageMap != nil {
		data, err := readBoundedArtifact(path(repository.LayerPageMapFile(d.Name)), repository.LayerPageMapFile(d.Name), d.PageMap.Size)
		if err != nil {
			return l, err
		}
		if l.PageMap, err = repository.DecodeLayerPageMap(d, data); err != nil {
			return l, err
		}
	}
	l.Data = repository.LocalLayerData(l.DataPath)
	return l, nil
}

// readBoundedArtifact reads a small artifact of at most size bytes; a
// missing one is an IntegrityError naming it.
func readBoundedArtifact(path, name string, size int64) ([]byte, error) {
	data, err := untrusted.ReadBounded(path, size)
	if errors.Is(err, os.ErrNotExist) {
		return nil, &repository.IntegrityError{Artifact: name, Want: fmt.Sprint(size, " bytes"), Got: "no file"}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", repository.ErrIntegrity, name, err)
	}
	return data, nil
}

// ReplaceMemory implements repository.Layers: under the record lock, with
// no dependents, the new artifacts are stored under new names, the record
// is written (signed anew), and only then the retired layer's files and
// the markers at owners the snapshot no longer reads are removed. A crash
// at any point leaves the old record with its files, or the new one with
// its files (and maybe leftovers no record names, which delete removes
// with the directory).
func (r *Repo) ReplaceMemory(ctx context.Context, lz repository.Lease, req repository.ReplaceMemoryRequest) (repository.Record, error) {
	if err := r.writable(); err != nil {
		return repository.Record{}, fmt.Errorf("replace memory: %w", err)
	}
	return repository.ReplaceUnderLease(r, lz, func(id string) (repository.Record, error) { return r.replaceMemory(ctx, id, req) })
}

func (r *Repo) replaceMemory(ctx context.Context, id string, req repository.ReplaceMemoryRequest) (repository.Record, error) {
	rl, err := acquireLock(ctx, r.paths.recordLockPath(id), lockExclusive)
	if err != nil {
		return repository.Record{}, err
	}
	defer rl.release()
	cur, err := r.readRecord(id)
	if err != nil {
		return repository.Record{}, err
	}
	if err := repository.CheckReplaceMemory(cur, req, r.opts.SigningKey != nil); err != nil {
		return repository.Record{}, err
	}
	if err := r.checkNoDependents(id); err != nil {
		return repository.Record{}, err
	}
	next, err := r.storeReplacement(ctx, id, cur, req)
	if err != nil {
		return repository.Record{}, err
	}
	if next, err = repository.SignRecord(next, r.opts.SigningKey); err != nil {
		return repository.Record{}, err
	}
	if err := r.writeRecord(next, faultPoints{}); err != nil {
		return repository.Record{}, err
	}
	if old := repository.RetiredLayer(cur, next); old != nil {
		r.removeLayerFiles(id, old.Name)
	}
	r.unregister(id, repository.DroppedOwners(cur, next))
	return next, nil
}

// storeReplacement imports the new memory into id's directory and returns
// the record that names it.
func (r *Repo) storeReplacement(ctx context.Context, id string, cur repository.Record, req repository.ReplaceMemoryRequest) (repository.Record, error) {
	dir := r.paths.snapshotDir(id)
	if req.Layer != nil {
		own, err := r.importLayer(ctx, id, dir, req.Layer, req.Link, req.Progress)
		if err != nil {
			return repository.Record{}, err
		}
		return repository.ReplacedByLayer(cur, own), nil
	}
	mem, err := r.importArtifact(ctx, dir, importSpec{src: req.MemoryPath, name: repository.MemoryFileName,
		size: cur.MemorySize, digests: true, link: req.Link}, req.Progress)
	if err != nil {
		return repository.Record{}, err
	}
	if err := r.writeTables(dir, mem.tables); err != nil {
		return repository.Record{}, err
	}
	return repository.ReplacedByMemory(cur, mem.stored(), mem.tables, repository.MemoryFormatRaw, nil), nil
}

// removeLayerFiles removes a retired layer's files; best effort (a file
// left is named by no record, and goes with the directory).
func (r *Repo) removeLayerFiles(id, name string) {
	dir := r.paths.snapshotDir(id)
	for _, f := range []string{repository.LayerDataFile(name), repository.LayerPageMapFile(name),
		repository.LayerDigestsFile(name), repository.LayerSHA256DigestsFile(name)} {
		_, _ = removeDurable(dir, f)
	}
}
