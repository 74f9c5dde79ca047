package ops

import (
	"context"

	"warmstart/internal/node"
	"warmstart/internal/recorder"
)

// RecordManifest records the startup manifest of the snapshot ref names
// now on n's recorder, holding a lease on the snapshot, and attaches it.
// began, when not nil, is told the snapshot's id once the lease is held,
// before the recording restores it.
func RecordManifest(ctx context.Context, n *node.Node, ref string, began func(id string)) (recorder.Result, error) {
	rec, err := n.Repo.Lookup(ctx, ref)
	if err != nil {
		return recorder.Result{}, &SnapshotError{ref, err}
	}
	lease, err := n.Repo.LeaseExisting(ctx, rec.ID)
	if err != nil {
		return recorder.Result{}, &SnapshotError{ref, err}
	}
	defer lease.End()
	if began != nil {
		began(rec.ID)
	}
	return n.Recorder.Record(ctx, lease)
}
