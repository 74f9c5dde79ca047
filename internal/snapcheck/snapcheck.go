// Package snapcheck verifies published snapshots: it reads every artifact
// of a snapshot whole and compares it with what the record says, so that
// bit rot, truncation and swapped files are found by an operator before a
// restore meets them. It is `warmstart snapshot verify` and the daemon's
// POST /snapshots/{id}/verify.
//
// The memory file is read once, in CopyBufferBytes units, and the same pass
// computes its whole-file SHA-256 and fresh digest tables (package
// integrity); the fresh table is compared block by block with the stored
// one (of SHA-256 digests where the snapshot has it, else of CRC-32C), so
// every bad block is named, not only the first. Memory use is the buffer
// plus the stored and fresh tables (1/1024 of the memory file each for
// CRC-32C, 1/128 for SHA-256), whatever the memory file's size; a remote memory read in chunks adds one chunk (up to
// 64 MiB) and the chunk being decoded. Local memory files (posixfs) are
// read directly. Where the node keeps copies of the store's objects (s3),
// the snapshot is checked through a view of the store that has cached
// nothing (storeViewer), and remote memory is read straight from the
// store: a good copy this node kept must not hide what the store holds.
//
// A snapshot published before digest tables existed is reported as
// unverified, which is not a problem by itself; Options.AddDigests gives it
// the fresh table, but only when the memory file's SHA-256 matches the
// record, so a table never blesses bytes other than the published ones. It
// adds a table of SHA-256 digests to a snapshot published before there was
// one the same way.
package snapcheck

import (
	"context"
	"errors"
	"fmt"

	"warmstart/internal/integrity"
	"warmstart/internal/repository"
	"warmstart/internal/trust"
)

// CopyBufferBytes is the unit the artifacts are read in.
const CopyBufferBytes = 1 << 20

// Options choose what Verify does besides reading.
type Options struct {
	// AddDigests attaches the freshly computed digest tables a snapshot
	// lacks (of CRC-32C digests, of SHA-256 digests), once its memory
	// file matched the record's SHA-256.
	AddDigests bool
	// Cache also checks the blocks of the snapshot's memory that this
	// node's cache holds (where the repository keeps one: s3) against the
	// snapshot's digest table, and evicts those that fail: they are what
	// this node's restores read instead of the store's bytes.
	Cache bool
	// Trust, when it trusts any key, is the node's policy: a snapshot it
	// refuses to restore is a problem (KindTrust) however well its
	// artifacts match its record, which whoever writes the store rewrites.
	Trust *trust.Policy
	// Progress, when not nil, is called from Verify's goroutine as large
	// artifacts are read (Step is repository.StepVerify). It must not
	// block for long.
	Progress func(Progress)
}

// Progress reports how far the reading of one artifact has come.
type Progress struct {
	SnapshotID string
	repository.ImportProgress
}

// Verify reads every artifact of the snapshot ref (an id or an alias) and
// reports what it found. Problems with the snapshot are in the report,
// whose OK is then false; the error is for what stopped the verification
// itself: an unknown or malformed ref (ErrNotFound, ErrInvalidRequest), a
// snapshot deleted while it was read (ErrNotFound), a repository that
// cannot be reached, a cancelled context.
func Verify(ctx context.Context, repo repository.Repository, ref string, opts Options) (Report, error) {
	rec, err := repo.Lookup(ctx, ref)
	if errors.Is(err, repository.ErrIntegrity) {
		return unreadableRecord(ref, err), nil
	}
	if r, ok := aliasMismatch(ctx, repo, err); ok {
		return r, nil
	}
	if err != nil {
		return Report{}, fmt.Errorf("verify %s: %w", ref, err)
	}
	view, closeView, err := storeViewOf(ctx, repo)
	if err != nil {
		return Report{}, fmt.Errorf("verify %s: %w", ref, err)
	}
	defer closeView()
	r, err := verifyRecord(ctx, repo, view, rec, opts)
	if err != nil {
		return Report{}, fmt.Errorf("verify %s: %w", ref, err)
	}
	return r, nil
}

// VerifyAll verifies every listed snapshot, oldest first, then reports
// every catalog entry that does not decode (repository.Damaged: a record,
// an alias binding, in place or quarantined) as a snapshot with a record
// problem: List leaves those out, and they are the first thing wrong with
// a store. A snapshot deleted while the others are verified is left out.
func VerifyAll(ctx context.Context, repo repository.Repository, opts Options) ([]Report, error) {
	recs, err := repo.List(ctx, repository.Filter{})
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	view, closeView, err := storeViewOf(ctx, repo)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	defer closeView()
	reports := make([]Report, 0, len(recs))
	for _, rec := range recs {
		r, err := verifyRecord(ctx, repo, view, rec, opts)
		if errors.Is(err, repository.ErrNotFound) {
			continue
		}
		if err != nil {
			return reports, fmt.Errorf("verify %s: %w", rec.ID, err)
		}
		reports = append(reports, r)
	}
	damaged, err := repo.Damaged(ctx)
	if err != nil {
		return reports, fmt.Errorf("verify: damaged catalog entries: %w", err)
	}
	for _, d := range damaged {
		reports = append(reports, DamagedEntry(d))
	}
	return reports, nil
}

// DamagedEntry is the report of a catalog entry that does not decode (see
// repository.Damaged): a record problem saying what is wrong and where.
func DamagedEntry(d repository.Damage) Report {
	return unreadableRecord(d.Name, errors.New(d.String()))
}

// aliasMismatch is the report of an alias whose binding names a record
// that carries another alias (or none), when err, the error of looking
// it up, says so (repository.BindingMismatch): the operator asked to
// verify this alias, and the catalog contradicts itself.
func aliasMismatch(ctx context.Context, repo repository.Repository, err error) (Report, bool) {
	m, ok := repository.BindingMismatch(ctx, repo, err)
	if !ok {
		return Report{}, false
	}
	r := Report{ID: m.ID, Alias: m.Alias, Artifacts: []Artifact{},
		Problems: []Problem{{Kind: KindAlias, Message: m.String()}}}
	return r, true
}

// unreadableRecord is the report of a snapshot whose record exists but
// cannot be decoded: nothing else about it can be checked.
func unreadableRecord(ref string, err error) Report {
	r := Report{Problems: []Problem{{Kind: KindRecord, Message: err.Error()}}, Artifacts: []Artifact{}}
	if repository.RefIsID(ref) {
		r.ID = ref
	} else {
		r.Alias = ref
	}
	return r
}

// checker verifies one resolved snapshot into its report.
type checker struct {
	ctx  context.Context
	repo repository.Repository
	res  repository.Resolved
	opts Options
	r    *Report
	// judge is the stored digest table blocks were compared with (nil
	// when none could be used).
	judge *integrity.Table
	// layerJudges are a layered snapshot's: each layer's, bottom first.
	layerJudges []layerJudge
}

// layerJudge is the table a layer's blocks were compared with (nil when
// none could be used).
type layerJudge struct {
	desc  repository.LayerDescriptor
	judge *integrity.Table
}

// verifyRecord checks rec's catalog entries in repo and reads its
// artifacts through view (see storeViewOf).
func verifyRecord(ctx context.Context, repo, view repository.Repository, rec repository.Record, opts Options) (Report, error) {
	r := newReport(rec)
	// verify --all reaches a snapshot through its record, not through an
	// alias, so a record whose alias is bound elsewhere is asked about here.
	m, err := repository.RecordMismatch(ctx, repo, rec)
	if err != nil {
		return Report{}, err
	}
	if m != nil {
		r.Problems = append(r.Problems, Problem{Kind: KindAlias, Message: m.String()})
	}
	res, err := view.Resolve(ctx, rec.ID)
	if errors.Is(err, repository.ErrIntegrity) {
		r.unresolved(err)
		r.finish()
		return r, nil
	}
	if err != nil {
		return Report{}, err
	}
	// The checks read the record Resolve returned. A refinement or a
	// digest table attached since rec was read (a restore's learning
	// racing this verify) adds an artifact, so the report lists that
	// record's artifacts, keeping what was found about rec's alias.
	found := r.Problems
	r = newReport(res.Record)
	r.Problems = append(r.Problems, found...)
	if opts.Trust.Enforcing() {
		if err := opts.Trust.Check(res.Record); err != nil {
			r.Problems = append(r.Problems, Problem{Kind: KindTrust, Message: err.Error()})
		}
	}
	c := &checker{ctx: ctx, repo: view, res: res, opts: opts, r: &r}
	if err := c.run(); err != nil {
		return Report{}, err
	}
	if opts.Cache {
		if err := c.checkCache(repo); err != nil {
			return Report{}, err
		}
	}
	if err := stillListed(ctx, repo, rec.ID); err != nil {
		return Report{}, err
	}
	r.finish()
	return r, nil
}

// stillListed fails with ErrNotFound for a snapshot deleted while it was
// verified: what was read came from files already unlinked, and a caller
// told "ok" would find nothing to restore. Only a record found gone
// counts: a lookup that fails otherwise (a store that does not answer
// this once) leaves the verdict of the complete read as it is. A delete
// after this look is not seen; the check narrows the window, it does not
// close it.
func stillListed(ctx context.Context, repo repository.Repository, id string) error {
	if _, err := repo.Lookup(ctx, id); errors.Is(err, repository.ErrNotFound) {
		return fmt.Errorf("snapshot %s was deleted while it was being verified: %w", id, err)
	}
	return nil
}

// storeViewer is a repository whose node keeps copies of what its store
// holds and that can open a view of the store with none (s3.Repo).
type storeViewer interface {
	StoreView(ctx context.Context) (repository.Repository, func() error, error)
}

// storeViewOf is the view of repo's store a snapshot is verified
// through: where the node caches the store's objects, a view that has
// cached nothing, so that a good copy this node kept does not hide what
// the store holds; else repo itself. One view serves a whole verify; a
// view whose directory cannot be removed at close costs no verdict
// anything: the next view removes it once it is a day old.
func storeViewOf(ctx context.Context, repo repository.Repository) (repository.Repository, func() error, error) {
	sv, ok := findIn[storeViewer](repo)
	if !ok {
		return repo, func() error { return nil }, nil
	}
	view, closeView, err := sv.StoreView(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("open a view of the store past this node's cache: %w", err)
	}
	return view, closeView, nil
}

// findIn finds the T that repo is or wraps (a daemon times its
// repository: metrics' wrapper has Unwrap).
func findIn[T any](repo repository.Repository) (T, bool) {
	for {
		if t, ok := repo.(T); ok {
			return t, true
		}
		u, ok := repo.(interface{ Unwrap() repository.Repository })
		if !ok {
			var none T
			return none, false
		}
		repo = u.Unwrap()
	}
}

// run checks the small artifacts first, then reads the memory file.
func (c *checker) run() error {
	if err := c.vmState(); err != nil {
		return err
	}
	var stored [2]*integrity.Table
	if !c.res.Record.Layered() {
		for i, st := range c.storedTables() {
			stored[i] = c.table(st)
		}
	}
	c.manifest()
	c.refinement()
	c.startupPack()
	if c.res.Record.Layered() {
		return c.layers()
	}
	fresh, err := c.memory(stored)
	if err != nil {
		return err
	}
	if c.opts.AddDigests && wantsTables(c.res.Record) {
		return c.addDigests(fresh)
	}
	return nil
}

// wantsTables reports whether AddDigests gives rec a table: it lacks
// one of the two a publish stores.
func wantsTables(rec repository.Record) bool {
	return rec.MemoryDigests == nil || rec.MemorySHA256Digests == nil
}

// unresolved reports a snapshot the repository refused to resolve: the
// artifact the refusal names is bad, and nothing could be read.
func (r *Report) unresolved(err error) {
	var ie *repository.IntegrityError
	if !errors.As(err, &ie) || !r.hasArtifact(ie.Artifact) {
		r.Problems = append(r.Problems, Problem{Kind: KindUnresolved, Message: err.Error()})
		return
	}
	r.artifact(ie.Artifact).problem(KindUnresolved, "%v", err)
	for i := range r.Artifacts {
		if a := &r.Artifacts[i]; a.Status == StatusNotChecked {
			a.Note = "not checked: the snapshot does not resolve"
		}
	}
}

func (r *Report) hasArtifact(name string) bool {
	for _, a := range r.Artifacts {
		if a.Name == name {
			return true
		}
	}
	return false
}

// progress reports done of total bytes of artifact read.
func (c *checker) progress(artifact string, total int64) func(int64) {
	if c.opts.Progress == nil {
		return nil
	}
	return func(done int64) {
		c.opts.Progress(Progress{SnapshotID: c.r.ID, ImportProgress: repository.ImportProgress{
			Artifact: artifact, Step: repository.StepVerify, DoneBytes: done, TotalBytes: total}})
	}
}
