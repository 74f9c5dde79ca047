package ops

import (
	"context"
	"errors"
	"fmt"

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

// NotRecorded is the error of a snapshot published (id) whose startup
// manifest recording then failed with err: it restores with on-demand
// reads. A recording discarded because the snapshot was deleted meanwhile
// says so.
func NotRecorded(id string, err error) error {
	if errors.Is(err, recorder.ErrDiscarded) {
		return fmt.Errorf("snapshot %s was published, then deleted (or its capture lease lost) before its startup manifest could be attached: %w", id, err)
	}
	return fmt.Errorf("snapshot %s published, but its startup manifest was not: %w", id, err)
}
