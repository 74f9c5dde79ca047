package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/node"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// ErrNoManifest is the error of a restore that asked to prefetch
// (prefetch on) a snapshot without a startup manifest: it was asked for
// explicitly, so restoring on demand instead would hide the mistake.
var ErrNoManifest = errors.New("no startup manifest to prefetch")

// SnapshotError is the error of an operation that could not look up or
// resolve the snapshot Ref names (Err keeps the repository's sentinel),
// before it did anything to it.
type SnapshotError struct {
	Ref string
	Err error
}

func (e *SnapshotError) Error() string { return fmt.Sprintf("snapshot %s: %v", e.Ref, e.Err) }
func (e *SnapshotError) Unwrap() error { return e.Err }

// Resolve turns an id or alias into the source a restore reads, in repo.
func Resolve(ctx context.Context, repo repository.Repository, ref string) (restore.Source, error) {
	ref, err := ExpandRef(ctx, repo, ref)
	if err != nil {
		return restore.Source{}, &SnapshotError{ref, err}
	}
	rec, err := repo.Lookup(ctx, ref)
	if err != nil {
		return restore.Source{}, &SnapshotError{ref, err}
	}
	res, err := repo.Resolve(ctx, rec.ID)
	if err != nil {
		return restore.Source{}, &SnapshotError{ref, err}
	}
	return restore.SourceIn(ctx, repo, res), nil
}

// Restore restores the snapshot ref names on n with opts, hands what the
// restore observed to n's learner, and describes the ready restore. The
// caller holds the instance and stops it; names says how it names the
// request's fields (its errors name them so).
func Restore(ctx context.Context, n *node.Node, ref string, opts restore.Options, names Names) (*restore.Instance, api.RestoreInfo, error) {
	src, err := Resolve(ctx, n.Repo, ref)
	if err != nil {
		return nil, api.RestoreInfo{}, err
	}
	if opts.Prefetch == restore.ModeOn && src.Manifest == nil {
		p := names.name("prefetch")
		return nil, api.RestoreInfo{}, fmt.Errorf("%s %q: snapshot %s has no startup manifest: record one with `warmstart snapshot record-manifest %s` (publish records one in the background unless [manifest] record_after_publish = false), or restore with %s %q or %q: %w",
			p, restore.ModeOn, ref, ref, p, restore.ModeAuto, restore.ModeOff, ErrNoManifest)
	}
	started := time.Now()
	inst, err := n.Restorer.Restore(ctx, src, opts)
	if err != nil {
		return nil, api.RestoreInfo{}, err
	}
	n.Learn(src.SnapshotID, inst)
	return inst, Describe(inst, src.SnapshotID, opts, started), nil
}

// Describe describes a ready restore of snapshot, made with opts and
// started at started. The daemon answers POST /restores with it and the
// CLI prints it for an in-process restore: one schema in both modes.
func Describe(inst *restore.Instance, snapshot string, opts restore.Options, started time.Time) api.RestoreInfo {
	return api.RestoreInfo{
		ID: inst.ID, Snapshot: snapshot, Device: opts.Device, IOEngine: opts.IOEngine, Policy: opts.Policy.Name,
		Generation: inst.Generation, StartedAt: started, Timings: inst.Timings, Prefetch: inst.Prefetch,
		DeviceBytes: inst.DeviceBytes, Cost: inst.Cost, Passthrough: inst.Passthrough, Ready: inst.Ready.Detail, State: inst.State(), StartupSet: inst.StartupSet,
	}
}
