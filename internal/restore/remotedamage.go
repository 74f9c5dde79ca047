package restore

import (
	"errors"
	"sync/atomic"

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
	first  atomic.Pointer[error]
	report func(error)
	// gone says whether the snapshot was deleted; nil when the restore
	// cannot ask, and then a missing object is not taken for damage.
	gone func() bool
}

// note keeps err, and reports it, if it is the first damaged read.
func (d *remoteDamage) note(err error) {
	if d.damaged(err) && d.first.CompareAndSwap(nil, &err) {
		d.report(err)
	}
}

// damaged tells a failed read that is damage: bytes refused, or an object
// missing while the snapshot is still published.
func (d *remoteDamage) damaged(err error) bool {
	switch {
	case errors.Is(err, repository.ErrIntegrity):
		return true
	case errors.Is(err, repository.ErrNotFound):
		return d.gone != nil && !d.gone()
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

// watchedLower is a remote memory reader whose failed reads go to damage.
type watchedLower struct {
	repository.MemoryReader
	damage *remoteDamage
}

func (l watchedLower) ReadAt(p []byte, off int64) (int, error) {
	n, err := l.MemoryReader.ReadAt(p, off)
	if err != nil {
		l.damage.note(err)
	}
	return n, err
}

// remoteDamageOf is the watch of src's remote memory for this restore:
// damage is counted unless the snapshot was deleted meanwhile (a deletion
// is not damage, see Source.Gone).
func (r *Restorer) remoteDamageOf(src Source) *remoteDamage {
	return &remoteDamage{gone: src.Gone, report: func(err error) {
		if src.Gone != nil && src.Gone() {
			return
		}
		r.integrityFailed(src.SnapshotID, ArtifactMemory, err)
	}}
}
