package restore

import (
	"context"
	"errors"
	"sync/atomic"

	"warmstart/internal/integrity"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
)

// A remote memory source checks what it fetches (the S3 chunks against
// their digests, a raw object against the ETag it was resolved with) and
// refuses bytes that are not the published ones with
// repository.ErrIntegrity. To the file device that is a failed read of
// its lower (EIO for the guest), never a bad block its digest table
// caught, so the restore watches the reader itself: the first damaged
// read of a device generation is counted and logged as an integrity
// failure of the memory, and a restore that then fails says so, as it
// does for a bad block. An object missing (repository.ErrNotFound) is
// damage too while the snapshot is still published: a published
// snapshot's memory is never removed, so that is lost data; only a
// snapshot deleted meanwhile excuses it (see Source.Gone).

// remoteDamage is the first damaged read of a remote lower, reported once.
type remoteDamage struct {
	first atomic.Pointer[error]
	// count counts and logs a damaged read of a snapshot still there.
	count func(error)
	// gone says whether the snapshot was deleted; nil when the restore
	// cannot ask, and then a missing object is not taken for damage.
	gone func() bool
	// deletedSeen remembers a yes from gone: a deleted id never comes
	// back, so the failed reads after it need not ask the store again.
	deletedSeen atomic.Bool
}

// note keeps err, and counts it unless the snapshot was deleted, if it is
// the first damaged read: bytes refused, or an object missing while the
// snapshot is still published. It asks gone at most once per read.
func (d *remoteDamage) note(err error) {
	refused, missing := errors.Is(err, repository.ErrIntegrity), errors.Is(err, repository.ErrNotFound)
	if (!refused && !missing) || d.first.Load() != nil {
		return
	}
	deleted := d.deleted()
	if missing && (d.gone == nil || deleted) {
		return
	}
	if d.first.CompareAndSwap(nil, &err) && !deleted {
		d.count(err)
	}
}

// deleted reports whether the snapshot was deleted, as far as gone can
// tell.
func (d *remoteDamage) deleted() bool {
	if d.gone == nil {
		return false
	}
	if d.deletedSeen.Load() {
		return true
	}
	if d.gone() {
		d.deletedSeen.Store(true)
		return true
	}
	return false
}

// err is the first damaged read, or nil.
func (d *remoteDamage) err() error {
	if p := d.first.Load(); p != nil {
		return *p
	}
	return nil
}

// watchedLower is a remote memory reader whose failed reads go to damage
// and whose reads end with its generation's restores (reads).
type watchedLower struct {
	memdev.Lower
	damage *remoteDamage
	reads  *generationReads
}

// contextReader is a memory reader whose reads can be ended early.
type contextReader interface {
	ReadAtContext(ctx context.Context, p []byte, off int64) (int, error)
}

func (l *watchedLower) ReadAt(p []byte, off int64) (int, error) {
	var n int
	var err error
	if cr, ok := l.Lower.(contextReader); ok {
		n, err = cr.ReadAtContext(l.reads.context(), p, off)
	} else {
		n, err = l.Lower.ReadAt(p, off)
	}
	if err != nil {
		l.damage.note(err)
	}
	return n, err
}

var _ integrity.Uncacher = (*watchedLower)(nil)

// Uncache implements integrity.Uncacher for a reader that keeps a copy
// (the S3 node cache): the device's digest check refused bytes it served.
func (l *watchedLower) Uncache(off, length int64) {
	if u, ok := l.Lower.(integrity.Uncacher); ok {
		u.Uncache(off, length)
	}
}

// Refuse implements integrity.Uncacher, as Uncache does.
func (l *watchedLower) Refuse(off, length int64) {
	if u, ok := l.Lower.(integrity.Uncacher); ok {
		u.Refuse(off, length)
	}
}

// Close closes the reader once its generation has drained.
func (l *watchedLower) Close() error {
	l.reads.forget()
	return l.Lower.Close()
}

// remoteDamageOf is the watch of src's remote memory for this restore:
// damage is counted unless the snapshot was deleted meanwhile (a deletion
// is not damage, see Source.Gone).
func (r *Restorer) remoteDamageOf(src Source) *remoteDamage {
	return &remoteDamage{gone: src.Gone, count: func(err error) {
		r.integrityFailed(src.SnapshotID, ArtifactMemory, err)
	}}
}
