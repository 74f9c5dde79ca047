package restore

import (
	"errors"
	"sync/atomic"

	"warmstart/internal/repository"
)

// A remote memory source checks what it fetches (the S3 chunks against
// their digests, a raw object against the ETag it was resolved with) and
// refuses bytes that are not the published ones with
// repository.ErrIntegrity. To a memory device that is a failed read of its
// lower (EIO for the guest, or a fault the handler cannot serve), never a
// bad block its digest table caught, so the restore has the device tell
// it of every failed read (memdev.Request.OnReadError): the first damaged
// read of a device generation is counted and logged as an integrity
// failure of the memory, and a restore that then fails says so, as it
// does for a bad block. A device shared with an earlier restore tells the
// restore that made the generation. An object missing (repository.ErrNotFound) is
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

// remoteDamageOf is the watch of src's remote memory for this restore:
// damage is counted unless the snapshot was deleted meanwhile (a deletion
// is not damage, see Source.Gone).
func (r *Restorer) remoteDamageOf(src Source) *remoteDamage {
	return &remoteDamage{gone: src.Gone, count: func(err error) {
		r.integrityFailed(src.SnapshotID, ArtifactMemory, err)
	}}
}
