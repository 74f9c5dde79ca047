package restore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"

	"warmstart/internal/integrity"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
	"warmstart/internal/untrusted"
)

// Memory integrity on restore: the VMM state file is checked whole against
// the record's SHA-256 before the VMM may read it, and the memory device
// checks every block it reads from the lower file against the snapshot's
// digest table before any byte of it reaches the VM. A snapshot published
// before digest tables existed (a record of format 1) restores unverified,
// and says so once; a record of a later format without a table is refused.

// Integrity artifacts, as IntegrityObserver names them.
const (
	ArtifactMemory  = "memory"
	ArtifactVMState = "vm_state"
	ArtifactDigests = "digests"
)

// IntegrityObserver is implemented by observers that count integrity
// failures; artifact is one of the Artifact constants.
type IntegrityObserver interface {
	IntegrityFailure(artifact string)
}

// checkVMState compares the VMM state file with the record. It is small
// (device state; guest memory is the memory file), so hashing it on every
// restore costs little next to what a wrong one would do to the guest.
func (r *Restorer) checkVMState(src Source) error {
	if src.VMStateSHA256 == "" {
		return nil // a source not made from a record (tests of the device alone)
	}
	got, size, err := hashRegular(src.VMStatePath)
	if err == nil && (size != src.VMStateSize || got != src.VMStateSHA256) {
		err = &repository.IntegrityError{Artifact: repository.VMStateFileName,
			Want: fmt.Sprintf("%d bytes, sha256 %s", src.VMStateSize, src.VMStateSHA256),
			Got:  fmt.Sprintf("%d bytes, sha256 %s", size, got)}
	}
	if err != nil {
		r.integrityFailedUnlessGone(src, ArtifactVMState, err)
		return fmt.Errorf("check VM state: %w", err)
	}
	return nil
}

// loadDigests reads the digest table the restore checks the memory
// against (tableFor) and checks it against the record. It returns nil,
// nil for a snapshot published before tables existed, or when
// verification is off. A record of a format that always has a table and
// has none was changed after publish: taking the table away must not turn
// the checks off, so the restore is refused.
func (r *Restorer) loadDigests(src Source, opts Options) (*integrity.Table, error) {
	if opts.Unverified {
		return nil, nil
	}
	if src.Digests == nil && src.Record != nil && src.Record.RequiresDigests() {
		err := &repository.IntegrityError{Artifact: repository.DigestsFileName,
			Want: fmt.Sprintf("a digest table (every record of format %d has one)", src.Record.Format), Got: "none in the record"}
		r.integrityFailed(src.SnapshotID, ArtifactDigests, err)
		return nil, fmt.Errorf("digest table: %w", err)
	}
	f := r.tableFor(src)
	if f.desc == nil {
		if src.VMStateSHA256 != "" {
			r.warnUnverified(src.SnapshotID)
		}
		return nil, nil
	}
	t, err := f.read(src.Layout.FileSize)
	if err != nil {
		r.integrityFailedUnlessGone(src, ArtifactDigests, err)
		return nil, fmt.Errorf("digest table: %w", err)
	}
	return t, nil
}

// digestsFile is one of a source's digest tables.
type digestsFile struct {
	name, path string
	desc       *repository.DigestsDescriptor
}

// tableFor is the table the restore checks every block against: the one
// of SHA-256 digests where whoever could change the bytes cannot change
// the table with them, when the snapshot has one: on a node that trusts
// keys (a signature anchors the table) and for memory served through a
// node cache (the table comes from the store, the bytes from the cache).
// Elsewhere (a POSIX store on a node that trusts no key, where a writer of
// the bytes can rewrite the table and the record too) the one of CRC-32C
// digests, which catches every accident SHA-256 would, at a tenth of the
// cost (package integrity).
func (r *Restorer) tableFor(src Source) digestsFile {
	if src.SHA256Digests != nil && (r.Trust.Enforcing() || cached(src)) {
		return digestsFile{repository.SHA256DigestsFileName, src.SHA256DigestsPath, src.SHA256Digests}
	}
	return digestsFile{repository.DigestsFileName, src.DigestsPath, src.Digests}
}

// cached reports whether src's memory is served through a node-local
// cache below the device (CacheWarmer): the bytes then come from that
// cache, the table from the store.
func cached(src Source) bool {
	_, ok := src.Memory.(CacheWarmer)
	return ok
}

// read reads the table and checks it against its descriptor.
func (f digestsFile) read(fileSize int64) (*integrity.Table, error) {
	if f.path == "" {
		return nil, &repository.IntegrityError{Artifact: f.name, Want: "a table", Got: "no file"}
	}
	data, err := untrusted.ReadBounded(f.path, f.desc.Size)
	if err != nil {
		return nil, err
	}
	if got := repository.DescribeDigests(data); got.SHA256 != f.desc.SHA256 || got.Size != f.desc.Size {
		return nil, &repository.IntegrityError{Artifact: f.name, Want: f.desc.SHA256, Got: got.SHA256}
	}
	t, err := integrity.Decode(data, fileSize)
	if err == nil && string(t.Algorithm()) != f.desc.Algorithm {
		return nil, &repository.IntegrityError{Artifact: f.name,
			Want: "a table of " + f.desc.Algorithm, Got: "one of " + string(t.Algorithm())}
	}
	return t, err
}

// unverifiedReported holds the snapshots this process already reported as
// having no digest table, so each is reported once.
var unverifiedReported sync.Map

func (r *Restorer) warnUnverified(snapshot string) {
	if _, seen := unverifiedReported.LoadOrStore(snapshot, struct{}{}); seen || r.Log == nil {
		return
	}
	r.Log.Warn("snapshot has no digest table: its memory is served unverified; "+
		"`warmstart snapshot verify --add-digests` adds one", "snapshot", snapshot)
}

// corruptionReporter is what devices call, once per bad block.
func (r *Restorer) corruptionReporter(snapshot string) func(*integrity.BlockError) {
	return func(e *integrity.BlockError) { r.integrityFailed(snapshot, ArtifactMemory, e) }
}

// integrityFailedUnlessGone counts and logs err as an integrity failure
// unless the file is not there because the snapshot went: the counter is
// of damaged snapshots, and one deleted while this restore ran (the
// recorder's background restores meet that race, and end as discarded)
// has none. A file missing from a snapshot still there is damage (an
// artifact removed, or an object missing from the store, which the s3
// backend hands over as a missing file): it is counted. The restore fails
// either way, naming the file.
func (r *Restorer) integrityFailedUnlessGone(src Source, artifact string, err error) {
	if errors.Is(err, fs.ErrNotExist) && src.Gone != nil && src.Gone() {
		return
	}
	r.integrityFailed(src.SnapshotID, artifact, err)
}

// RecordGetter is the part of a repository that says whether a snapshot
// is still there.
type RecordGetter interface {
	Get(context.Context, string) (repository.Record, error)
}

// SourceIn adapts a record resolved from repo, as SourceOf does, and lets
// the restore ask repo whether the snapshot went while it ran (Gone).
func SourceIn(ctx context.Context, repo RecordGetter, r repository.Resolved) Source {
	src := SourceOf(r)
	src.Gone = DeletedFrom(ctx, repo, r.Record.ID)
	return src
}

// DeletedFrom is a Source.Gone that asks repo whether the record of id is
// gone. Any other answer (there, damaged, or the question failed) is not
// gone: only a deletion excuses a missing file.
func DeletedFrom(ctx context.Context, repo RecordGetter, id string) func() bool {
	return func() bool {
		_, err := repo.Get(context.WithoutCancel(ctx), id)
		return errors.Is(err, repository.ErrNotFound)
	}
}

func (r *Restorer) integrityFailed(snapshot, artifact string, err error) {
	if o, ok := r.Observe.(IntegrityObserver); ok {
		o.IntegrityFailure(artifact)
	}
	if r.Log != nil {
		r.Log.Error("snapshot integrity check failed; the bytes are not served", "snapshot", snapshot,
			"artifact", artifact, "err", err)
	}
}

// verifiersFor is what the device checks src's memory with: one verifier
// of its memory file, or for a layered memory (repository.ChainSource)
// one per layer, each layer's table read and checked against the layer's
// descriptor. A layered record always has both tables of every layer
// (Record.Validate), so no layer is ever served unverified but by
// Options.Unverified.
func (r *Restorer) verifiersFor(src Source, opts Options) (*memdev.Verifier, []*memdev.Verifier, error) {
	chain, ok := src.Memory.(*repository.ChainSource)
	if !ok {
		digests, err := r.loadDigests(src, opts)
		return r.verifier(src, digests), nil, err
	}
	if opts.Unverified {
		return nil, nil, nil
	}
	out := make([]*memdev.Verifier, len(chain.Layers()))
	for i, l := range chain.Layers() {
		f := r.layerTableFor(l)
		t, err := f.read(l.Descriptor.Size)
		if err != nil {
			r.integrityFailedUnlessGone(src, ArtifactDigests, err)
			return nil, nil, fmt.Errorf("digest table of memory layer %d (%s of snapshot %s): %w", i, l.Descriptor.Name, l.Descriptor.Snapshot, err)
		}
		out[i] = r.verifier(src, t)
	}
	return nil, out, nil
}

// layerTableFor is tableFor of one layer: SHA-256 on a node that trusts
// keys (the child's signature pins every layer's table) or for a layer
// read through a node cache, CRC-32C elsewhere.
func (r *Restorer) layerTableFor(l repository.ResolvedLayer) digestsFile {
	d := l.Descriptor
	if _, cachedLayer := l.Data.(CacheWarmer); r.Trust.Enforcing() || cachedLayer {
		return digestsFile{repository.LayerSHA256DigestsFile(d.Name), l.SHA256DigestsPath, d.SHA256Digests}
	}
	return digestsFile{repository.LayerDigestsFile(d.Name), l.DigestsPath, d.Digests}
}

// verifier is what the device checks src's memory with: t, reporting
// each bad block; nil (unverified) without a table.
func (r *Restorer) verifier(src Source, t *integrity.Table) *memdev.Verifier {
	if t == nil {
		return nil
	}
	return &memdev.Verifier{Table: t, OnCorrupt: r.corruptionReporter(src.SnapshotID)}
}

// markIntegrity makes a chain holding a bad block match ErrIntegrity too.
func markIntegrity(err error) error {
	if err == nil || errors.Is(err, repository.ErrIntegrity) {
		return err
	}
	return fmt.Errorf("%w: %w", repository.ErrIntegrity, err)
}

// integrityIf marks a lower file that does not fit its digest table (it
// changed size since publish) as an integrity failure.
func integrityIf(err error) error {
	if errors.Is(err, integrity.ErrSizeChanged) || errors.Is(err, integrity.ErrCorrupt) {
		return markIntegrity(err)
	}
	return err
}

// hashRegular returns the SHA-256 and size of the regular file at path.
func hashRegular(path string) (string, int64, error) {
	f, err := untrusted.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
