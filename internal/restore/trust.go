package restore

import (
	"warmstart/internal/repository"
	"warmstart/internal/trust"
)

// checkTrust refuses, before anything of the snapshot is read, a source
// whose record the node's trusted keys do not vouch for: unsigned,
// signed by no trusted key, or changed since (trust.Policy.Check). What
// the restore serves by (the id, layout, VM state and digest table
// descriptors) must be the record's, so the signature covers it.
func (r *Restorer) checkTrust(src Source) error {
	if !r.Trust.Enforcing() {
		return nil
	}
	err := anchored(src)
	if err == nil {
		err = r.Trust.Check(*src.Record)
	}
	if err != nil && r.Log != nil {
		r.Log.Error("snapshot refused: no key this node trusts vouches for it; nothing of it is served",
			"snapshot", src.SnapshotID, "err", err)
	}
	return err
}

// anchored refuses a source that is not made from its record as SourceOf
// makes it.
func anchored(src Source) error {
	rec := src.Record
	why := ""
	switch {
	case rec == nil:
		why = "the restore was given no record to check"
	case rec.ID != src.SnapshotID || !rec.Layout.Equal(src.Layout):
		why = "the restore's id or layout is not its record's"
	case rec.VMStateSize != src.VMStateSize || rec.VMStateSHA256 != src.VMStateSHA256:
		why = "the restore's VM state is not its record's"
	case !sameDigests(rec.MemoryDigests, src.Digests) || rec.MemorySHA256Digests == nil ||
		!sameDigests(rec.MemorySHA256Digests, src.SHA256Digests):
		why = "the restore's digest tables are not its record's"
	default:
		return nil
	}
	return &trust.RefusedError{Snapshot: src.SnapshotID, Reason: why}
}

func sameDigests(a, b *repository.DigestsDescriptor) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}
