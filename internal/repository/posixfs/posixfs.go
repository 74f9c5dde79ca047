// Package posixfs is the repository backend that keeps snapshots as files
// under one directory (the snapshot store) on a local or shared POSIX file
// system. Several processes may use one store at once: changes to a snapshot
// are serialised by flock(2) locks, every catalog change is a durable
// rename, and a process killed at any point leaves nothing half-visible.
//
// The files are split by concern: layout.go maps names to paths, catalog.go
// reads and writes records and aliases, artifacts.go imports snapshot files,
// lock.go and lease.go hold the locks, durable.go does the ordered writes,
// sweep.go reclaims what crashed writers left, and this file composes them
// into the repository operations.
package posixfs

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"warmstart/internal/durable"
	"warmstart/internal/repository"
)

// Options tune a Repo.
type Options struct {
	// ForceCopy makes Publish copy (and verify) artifacts even where a hard
	// link would work. It covers the case of a capture directory on another
	// file system than the store, and owners who want no inode shared with
	// files the VMM wrote.
	ForceCopy bool
	// ReadOnly opens an existing store for reading only (list, show,
	// resolve, verify): nothing is created, no lock file is made, nothing
	// is swept, so a store on a read-only file system, or one an operator
	// only looks at, is left exactly as it is. A missing store is an
	// error naming its path. Operations that change the store fail with
	// ErrInvalidRequest.
	ReadOnly bool
	// SigningKey, when set, signs every record Publish commits
	// (repository.SignRecord), so a snapshot is visible only signed.
	SigningKey ed25519.PrivateKey
	// Warn is told what the writable open's sweep could not clean up (an
	// entry it cannot read or remove: a directory where an alias file
	// belongs, an immutable leftover). The open goes on without it: the
	// sweep is housekeeping, and one entry it cannot handle must not stop
	// every import, delete and daemon start on the store. The next
	// writable open tries again. Nil ignores it.
	Warn func(error)
}

// Repo is a snapshot store rooted at one directory.
type Repo struct {
	paths paths
	opts  Options

	// faultHook, when a test in this package sets it, runs at every fault
	// point (faultpoint.go); nil everywhere else.
	faultHook func(point string)
	// afterCopy, when set by a test, runs between a copy's fsync and its
	// verification pass.
	afterCopy func(path string)
	// afterResolveRecord, when set by a test, runs in Resolve between
	// reading the record and checking the artifacts.
	afterResolveRecord func(id string)

	// swept holds the dangling alias bindings this Repo's sweeps released
	// (alias → the missing id), until TakeSweptAlias reports each.
	sweptMu sync.Mutex
	swept   map[string]string
}

var _ repository.Repository = (*Repo)(nil)

// Open opens the store at root, creating its directories if needed, and
// sweeps away what crashed writers left (see Sweep).
func Open(root string, opts Options) (*Repo, error) {
	if root == "" {
		return nil, fmt.Errorf("open snapshot store: %w: no directory given", repository.ErrInvalidRequest)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("open snapshot store %s: %w", root, err)
	}
	r := &Repo{paths: paths{root: abs}, opts: opts}
	if opts.ReadOnly {
		return r, r.checkExists()
	}
	if err := os.MkdirAll(abs, dirMode); err != nil {
		return nil, fmt.Errorf("open snapshot store: %w", err)
	}
	if err := r.checkNotForeign(); err != nil {
		return nil, err
	}
	for _, dir := range r.paths.dirs() {
		if err := mkdirDurable(dir); err != nil {
			return nil, fmt.Errorf("open snapshot store %s: %w", abs, err)
		}
	}
	if r.onReadOnlyMount() {
		// Nothing can be swept, and every change is refused as it comes
		// (writable): the store is read as it is, without a warning at
		// every open.
		return r, nil
	}
	if err := r.Sweep(context.Background()); err != nil && opts.Warn != nil {
		opts.Warn(fmt.Errorf("snapshot store %s: %w", abs, err))
	}
	return r, nil
}

// checkNotForeign refuses to make a store in a directory that holds
// something else: a mistyped snapshot_store naming a home or /etc would
// otherwise get catalog/ and snapshots/ beside its files, and the publish
// would land where no node looks. A store (catalog/ or snapshots/ there),
// an empty directory and one holding only lost+found (a file system
// mounted there) are fine.
func (r *Repo) checkNotForeign() error {
	for _, dir := range []string{r.paths.catalogDir(), r.paths.snapshotsDir()} {
		if _, err := os.Lstat(dir); err == nil {
			return nil
		}
	}
	entries, err := os.ReadDir(r.paths.root)
	if err != nil {
		return fmt.Errorf("open snapshot store %s: %w", r.paths.root, err)
	}
	for _, e := range entries {
		if e.Name() != "lost+found" {
			return fmt.Errorf("%w: open snapshot store %s: it holds %s but no snapshot store (catalog/, snapshots/): "+
				"point [backend.posix_fs] snapshot_store at a store or at an empty or new directory",
				repository.ErrInvalidRequest, r.paths.root, e.Name())
		}
	}
	return nil
}

// onReadOnlyMount reports whether the store's file system is mounted
// read-only now (a read-only bind mount, a remount after errors). Asked
// at every change, not once: a mount can turn read-only, or back, under
// an open store.
func (r *Repo) onReadOnlyMount() bool {
	var st unix.Statfs_t
	return unix.Statfs(r.paths.root, &st) == nil && st.Flags&unix.ST_RDONLY != 0
}

// checkExists confirms a store is at the root: its directories are there.
func (r *Repo) checkExists() error {
	for _, dir := range append([]string{r.paths.root}, r.paths.dirs()...) {
		fi, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("open snapshot store %s: %w", r.paths.root, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("open snapshot store %s: %s is not a directory", r.paths.root, dir)
		}
	}
	return nil
}

// writable refuses changes to a store opened read-only (the caller's
// mistake: ErrInvalidRequest) and to one whose file system is mounted
// read-only (the host's: EROFS, a daemon's 507), naming the store rather
// than the first file a change would have made in it.
func (r *Repo) writable() error {
	if r.opts.ReadOnly {
		return fmt.Errorf("%w: snapshot store %s is open read-only", repository.ErrInvalidRequest, r.paths.root)
	}
	if r.onReadOnlyMount() {
		return fmt.Errorf("snapshot store %s is on a read-only mount (it can be read, not changed): %w", r.paths.root, syscall.EROFS)
	}
	return nil
}

// Root is the store's directory.
func (r *Repo) Root() string { return r.paths.root }

// BeginCapture implements repository.Repository.
func (r *Repo) BeginCapture(ctx context.Context) (repository.Lease, error) {
	if err := r.writable(); err != nil {
		return nil, fmt.Errorf("begin capture: %w", err)
	}
	id, err := repository.NewID()
	if err != nil {
		return nil, fmt.Errorf("begin capture: %w", err)
	}
	lk, err := acquireLock(ctx, r.paths.leasePath(id), lockShared)
	if err != nil {
		return nil, fmt.Errorf("begin capture %s: %w", id, err)
	}
	return r.newLease(id, lk), nil
}

// LeaseExisting implements repository.Repository.
func (r *Repo) LeaseExisting(ctx context.Context, id string) (repository.Lease, error) {
	if err := r.writable(); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	if err := repository.ValidateID(id); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	lk, err := acquireLock(ctx, r.paths.leasePath(id), lockShared)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", id, err)
	}
	if _, err := r.readRecord(id); err != nil {
		lk.release()
		return nil, fmt.Errorf("lease: %w", err)
	}
	return r.newLease(id, lk), nil
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
	vmSize, memSize := sizes.VMState, sizes.Memory
	if err := r.checkPublishable(id, req.Alias); err != nil {
		return repository.Record{}, err
	}
	published := false
	defer func() {
		if !published {
			_ = r.removeSnapshotDir(id)
		}
	}()
	dir, err := r.freshSnapshotDir(id)
	if err != nil {
		return repository.Record{}, err
	}
	r.fault(FaultPublishAfterDir)

	vm, err := r.importArtifact(ctx, dir, importSpec{src: req.VMStatePath, name: repository.VMStateFileName,
		size: vmSize, tempFault: FaultPublishAfterVMStateTemp, link: req.Link,
		field: repository.FieldVMState}, req.Progress)
	if err != nil {
		return repository.Record{}, err
	}
	mem, err := r.importArtifact(ctx, dir, importSpec{src: req.MemoryPath, name: repository.MemoryFileName,
		size: memSize, tempFault: FaultPublishAfterMemoryTemp, digests: true, link: req.Link,
		field: repository.FieldMemory}, req.Progress)
	if err != nil {
		return repository.Record{}, err
	}
	if err := r.writeTables(dir, mem.tables); err != nil {
		return repository.Record{}, err
	}
	r.fault(FaultPublishAfterArtifacts)

	rec, err := repository.SignRecord(repository.NewRecord(id, req, vm.stored(), mem.stored(), mem.tables), r.opts.SigningKey)
	if err != nil {
		return repository.Record{}, err
	}
	if err := r.commitRecord(ctx, rec); err != nil {
		return repository.Record{}, err
	}
	published = true
	return rec, nil
}

// checkPublishable refuses a publish of id that has a record already, and
// fails fast, before a long copy, if alias is plainly taken (the binding
// itself is decided under the alias lock at the end).
func (r *Repo) checkPublishable(id, alias string) error {
	if exists, err := r.recordExists(id); err != nil || exists {
		return errors.Join(err, alreadyPublished(exists))
	}
	if alias == "" {
		return nil
	}
	return r.checkAliasFree(alias, id)
}

// freshSnapshotDir makes id's snapshot directory anew, durably. The
// caller holds the lease and no record of id exists, so whatever is there
// is a leftover of an earlier failed attempt under it.
func (r *Repo) freshSnapshotDir(id string) (string, error) {
	if err := r.removeSnapshotDir(id); err != nil {
		return "", err
	}
	dir := r.paths.snapshotDir(id)
	if err := os.Mkdir(dir, dirMode); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	return dir, durable.Sync(r.paths.snapshotsDir())
}

// writeTables stores the memory file's digest tables in dir, durably.
func (r *Repo) writeTables(dir string, tables repository.DigestTables) error {
	for name, table := range map[string][]byte{repository.DigestsFileName: tables.CRC, repository.SHA256DigestsFileName: tables.SHA256} {
		if err := r.writeFileDurable(dir, name, table, artifactFileMode, faultPoints{}); err != nil {
			return err
		}
	}
	return durable.Sync(dir)
}

// commitRecord binds the alias and writes the record, the visibility point,
// under the record lock and then the alias lock (the order every operation
// takes them in).
func (r *Repo) commitRecord(ctx context.Context, rec repository.Record) error {
	rl, err := acquireLock(ctx, r.paths.recordLockPath(rec.ID), lockExclusive)
	if err != nil {
		return err
	}
	defer rl.release()
	if exists, err := r.recordExists(rec.ID); err != nil || exists {
		return errors.Join(err, alreadyPublished(exists))
	}
	if rec.Alias != "" {
		al, err := acquireLock(ctx, r.paths.aliasLockPath(rec.Alias), lockExclusive)
		if err != nil {
			return err
		}
		defer al.release()
		if err := r.bindAlias(rec.Alias, rec.ID); err != nil {
			return err
		}
	}
	fp := faultPoints{afterTemp: FaultPublishAfterRecordTemp, afterRename: FaultPublishAfterRecord}
	if err := r.writeRecord(rec, fp); err != nil {
		// The rename may have happened before a failed directory sync:
		// take the record back before the artifacts go.
		_, _ = r.removeRecord(rec.ID)
		if rec.Alias != "" {
			_ = r.unbindAlias(rec.Alias, rec.ID)
		}
		return err
	}
	return nil
}

func alreadyPublished(exists bool) error {
	if !exists {
		return nil
	}
	return fmt.Errorf("%w: the lease's snapshot is already published", repository.ErrInvalidRequest)
}

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

// attachFaults are the fault points of one kind of attach, in order.
type attachFaults struct{ clear, fileTemp, file, recordTemp, record string }

func faultsOf(a repository.Attachment) attachFaults {
	if repository.IsRefinementFile(a.Name) {
		return attachFaults{"", FaultRefineAfterFileTemp, FaultRefineAfterFile, FaultRefineAfterRecordTemp, FaultRefineAfterRecord}
	}
	if repository.IsDigestsFile(a.Name) {
		return attachFaults{FaultDigestsAfterClear, FaultDigestsAfterTableTemp, FaultDigestsAfterTable,
			FaultDigestsAfterRecordTemp, FaultDigestsAfterRecord}
	}
	return attachFaults{FaultAttachAfterClear, FaultAttachAfterManifestTemp, FaultAttachAfterManifest,
		FaultAttachAfterRecordTemp, FaultAttachAfterRecord}
}

// attach stores a's file and then the record describing it, under the
// record lock: the file first, so a record never describes bytes that are
// not durably there.
func (r *Repo) attach(ctx context.Context, id string, a repository.Attachment) error {
	rl, err := acquireLock(ctx, r.paths.recordLockPath(id), lockExclusive)
	if err != nil {
		return err
	}
	defer rl.release()
	// Under the record lock a Delete either has finished (no record: refuse)
	// or has not begun (it waits for us, then removes what we write).
	rec, err := r.readRecord(id)
	if err != nil {
		return err
	}
	if err := a.Check(rec); err != nil {
		return err
	}
	fp := faultsOf(a)
	if has, same := a.DescribedBy(rec); has && !same {
		// Drop the old descriptor before replacing the file, so a crash in
		// between never pairs a descriptor with other bytes.
		if err := r.writeRecord(a.Cleared(rec), faultPoints{afterRename: fp.clear}); err != nil {
			return err
		}
	}
	if err := r.writeAttachedFile(id, a, fp); err != nil {
		return err
	}
	if err := r.writeRecord(a.Attached(rec), faultPoints{afterTemp: fp.recordTemp, afterRename: fp.record}); err != nil {
		return err
	}
	if old := a.Superseded(rec); old != "" && old != a.Name {
		// Best effort: a file left here is named by no record, and Delete
		// removes the snapshot's directory whole.
		_, _ = removeDurable(r.paths.snapshotDir(id), old)
	}
	return nil
}

// writeAttachedFile stores a's file, if it has one. writeFileDurable never
// creates the directory, so even a store edited behind our back cannot
// get a deleted snapshot's directory back.
func (r *Repo) writeAttachedFile(id string, a repository.Attachment, fp attachFaults) error {
	if !a.HasFile() {
		return nil
	}
	err := r.writeFileDurable(r.paths.snapshotDir(id), a.Name, a.Data, artifactFileMode,
		faultPoints{afterTemp: fp.fileTemp, afterRename: fp.file})
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: snapshot directory is missing: %w", repository.ErrIntegrity, err)
	}
	return err
}

// Resolve implements repository.Repository.
func (r *Repo) Resolve(ctx context.Context, id string) (repository.Resolved, error) {
	rec, err := r.Get(ctx, id)
	if err != nil {
		return repository.Resolved{}, fmt.Errorf("resolve: %w", err)
	}
	if r.afterResolveRecord != nil {
		r.afterResolveRecord(id)
	}
	res := repository.Resolved{
		Record:      rec,
		VMStatePath: r.paths.artifactPath(id, repository.VMStateFileName),
	}
	if err := checkArtifact(res.VMStatePath, repository.VMStateFileName, rec.VMStateSize); err != nil {
		return repository.Resolved{}, r.goneOr(ctx, id, fmt.Errorf("resolve %s: %w", id, err))
	}
	if rec.Layered() {
		chain, err := r.resolveLayers(rec)
		if err != nil {
			return repository.Resolved{}, r.goneOr(ctx, id, fmt.Errorf("resolve %s: %w", id, err))
		}
		res.Memory = chain
	} else {
		res.MemoryPath = r.paths.artifactPath(id, repository.MemoryFileName)
		if err := checkArtifact(res.MemoryPath, repository.MemoryFileName, rec.MemorySize); err != nil {
			return repository.Resolved{}, r.goneOr(ctx, id, fmt.Errorf("resolve %s: %w", id, err))
		}
	}
	if rec.Manifest != nil {
		res.ManifestPath = r.paths.artifactPath(id, repository.ManifestFileName)
	}
	if rec.MemoryDigests != nil {
		res.DigestsPath = r.paths.artifactPath(id, repository.DigestsFileName)
	}
	if rec.MemorySHA256Digests != nil {
		res.SHA256DigestsPath = r.paths.artifactPath(id, repository.SHA256DigestsFileName)
	}
	if d := rec.Refinement; d != nil {
		res.RefinementPath = r.paths.artifactPath(id, repository.RefinementFileName(d.SHA256))
	}
	return res, nil
}

// goneOr reports a snapshot deleted while Resolve ran as ErrNotFound, as
// the s3 backend's goneOr does: Delete removes the record before the
// artifacts, so an artifact missing from a record read a moment ago is no
// damage when the record is gone now. Anything else keeps err (an
// artifact missing from a snapshot still there is ErrIntegrity).
func (r *Repo) goneOr(ctx context.Context, id string, err error) error {
	if !errors.Is(err, repository.ErrIntegrity) {
		return err
	}
	if _, gerr := r.Get(ctx, id); errors.Is(gerr, repository.ErrNotFound) {
		return fmt.Errorf("resolve %s: %w: deleted while it was resolved", id, repository.ErrNotFound)
	}
	return err
}

// Delete implements repository.Repository.
func (r *Repo) Delete(ctx context.Context, id string) error { return r.checkedDelete(ctx, id, false) }

// DeleteRecorded implements repository.RecordedDeleter: it deletes id only
// if its record (in place or quarantined) is still there under the record
// lock, so of concurrent deletes of one snapshot exactly one succeeds and
// the others get ErrNotFound.
func (r *Repo) DeleteRecorded(ctx context.Context, id string) error {
	return r.checkedDelete(ctx, id, true)
}

// checkedDelete is delete after the checks both deletes make.
func (r *Repo) checkedDelete(ctx context.Context, id string, recorded bool) error {
	if err := repository.ValidateID(id); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if err := r.writable(); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if err := r.delete(ctx, id, recorded); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	return nil
}

func (r *Repo) delete(ctx context.Context, id string, recorded bool) error {
	rl, err := acquireLock(ctx, r.paths.recordLockPath(id), lockExclusive)
	if err != nil {
		return err
	}
	defer rl.release()
	if err := r.checkNoDependents(id); err != nil {
		return err
	}
	defer r.removeDependentsDir(id)
	rec, err := r.readRecord(id)
	switch {
	case errors.Is(err, repository.ErrNotFound):
		// Deleting the id of a quarantined record is how an operator
		// lets its artifacts (and any alias naming it) go.
		removed, err := removeDurable(r.paths.quarantinedRecordsDir(), recordFileName(id))
		if err != nil {
			return err
		}
		if recorded && !removed {
			// Another delete took the record between the caller's lookup
			// and this lock: that one reports the deletion.
			return fmt.Errorf("snapshot %s: %w", id, repository.ErrNotFound)
		}
		if err := r.reclaimUnpublished(id); err != nil {
			return err
		}
		return r.unbindAliasesOf(ctx, id)
	case errors.Is(err, repository.ErrIntegrity):
		// Undecodable, so its alias is unknown: unbindAliasesOf finds
		// every binding naming it once the record is gone.
		rec = repository.Record{ID: id}
	case err != nil:
		return err
	}
	if err := r.deleteRecord(ctx, rec); err != nil {
		return err
	}
	// Its markers at its owners went stale with the record.
	r.unregister(id, rec.Owners())
	if err := r.unbindAliasesOf(ctx, id); err != nil {
		return err
	}
	r.fault(FaultDeleteAfterAlias)
	if err := r.removeSnapshotDir(id); err != nil {
		return err
	}
	r.fault(FaultDeleteAfterArtifactsGone)
	return nil
}

// deleteRecord removes the record of rec.ID and unbinds the alias it
// carries, under that alias's lock. The caller holds the record lock.
func (r *Repo) deleteRecord(ctx context.Context, rec repository.Record) error {
	if rec.Alias != "" {
		al, err := acquireLock(ctx, r.paths.aliasLockPath(rec.Alias), lockExclusive)
		if err != nil {
			return err
		}
		defer al.release()
	}
	// Record first: once it is gone nobody can see the snapshot, and an
	// alias still naming it is recognisably stale.
	if _, err := r.removeRecord(rec.ID); err != nil {
		return err
	}
	r.fault(FaultDeleteAfterRecord)
	if rec.Alias != "" {
		return r.unbindAlias(rec.Alias, rec.ID)
	}
	return nil
}

// unbindAliasesOf removes every alias binding that still names id, whose
// record is gone: the alias of a record that did not decode (unknown to
// the delete), and bindings a crashed publish or delete left naming it.
// Each is re-read under its alias lock, taken alone and after the record
// lock (the order every operation takes them in), so a binding that a
// publisher took over meanwhile stays.
func (r *Repo) unbindAliasesOf(ctx context.Context, id string) error {
	entries, err := os.ReadDir(r.paths.aliasesDir())
	if err != nil {
		return fmt.Errorf("list aliases: %w", err)
	}
	for _, e := range entries {
		alias := e.Name()
		if repository.ValidateAlias(alias) != nil {
			continue // temporary files and strays are the sweep's
		}
		if holder, err := r.readAlias(alias); err != nil || holder != id {
			continue // another snapshot's, or damaged: kept, never removed here
		}
		if err := r.unbindAliasNaming(ctx, alias, id); err != nil {
			return err
		}
	}
	return nil
}

// unbindAliasNaming removes alias under its lock if it names id then.
func (r *Repo) unbindAliasNaming(ctx context.Context, alias, id string) error {
	al, err := acquireLock(ctx, r.paths.aliasLockPath(alias), lockExclusive)
	if err != nil {
		return err
	}
	defer al.release()
	if holder, err := r.readAlias(alias); err != nil || holder != id {
		return nil
	}
	if _, err := removeDurable(r.paths.aliasesDir(), alias); err != nil {
		return fmt.Errorf("unbind alias %s: %w", alias, err)
	}
	return nil
}

// reclaimUnpublished removes the directory of a snapshot that has no record
// if nobody holds a lease on it: a publish that failed or crashed, or a
// delete that crashed after removing the record. The caller holds the
// record lock.
func (r *Repo) reclaimUnpublished(id string) error {
	if _, err := os.Lstat(r.paths.snapshotDir(id)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	live, lk, err := r.leaseLive(id)
	if err != nil || live {
		// A live lease means a capture is still publishing it; its own
		// failure path or a later sweep cleans up.
		return err
	}
	defer lk.release()
	return r.removeSnapshotDir(id)
}

// mkdirDurable creates dir if missing and syncs its parent so the entry
// survives a crash.
func mkdirDurable(dir string) error {
	err := os.Mkdir(dir, dirMode)
	if errors.Is(err, os.ErrExist) {
		fi, serr := os.Stat(dir)
		if serr == nil && fi.IsDir() {
			return nil
		}
		return fmt.Errorf("%s exists and is not a directory", dir)
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return durable.Sync(filepath.Dir(dir))
}
