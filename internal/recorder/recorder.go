// Package recorder turns a restore into a startup manifest: it restores a
// throwaway instance of a published snapshot with access tracing on, takes
// the first touches until the guest is ready, stops the instance, builds the
// manifest (first-touch order, adjacent pages coalesced into runs) and
// attaches it to the snapshot atomically under the record lock.
//
// Recording runs in the background after publish, holding the capture lease
// for its whole length, so a publish never waits for it. If the snapshot is
// deleted meanwhile, the attach is refused by the repository and the work is
// discarded: nothing here ever recreates a record or its directory.
package recorder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"warmstart/internal/manifest"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// Recorder records startup manifests.
type Recorder struct {
	Repo     repository.Repository
	Restorer *restore.Restorer
	// Device and IOEngine are the memory device the throwaway instance uses.
	Device   string
	IOEngine int
	Log      *slog.Logger
	// Timeout bounds one recording; a guest that never becomes ready must
	// not hold the capture lease forever.
	Timeout time.Duration
}

// Result is what one recording produced.
type Result struct {
	SnapshotID string                        `json:"snapshot_id"`
	Descriptor repository.ManifestDescriptor `json:"descriptor"`
	Ranges     int                           `json:"ranges"`
	Bytes      int64                         `json:"bytes"`
	Touches    int                           `json:"touches"`
	ReadyAfter time.Duration                 `json:"ready_after_ns"`
}

// ErrDiscarded reports a recording whose snapshot was deleted, or whose
// lease ended, before the manifest could be attached.
var ErrDiscarded = errors.New("recording discarded")

// Record restores the leased snapshot once with tracing, builds its
// manifest and attaches it. It does not end the lease.
func (r *Recorder) Record(ctx context.Context, lease repository.Lease) (Result, error) {
	id := lease.SnapshotID()
	res := Result{SnapshotID: id}
	if r.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	resolved, err := r.Repo.Resolve(ctx, id)
	if err != nil {
		return res, r.discardOr(ctx, id, fmt.Errorf("record manifest %s: resolve: %w", id, err))
	}
	src := restore.SourceOf(resolved)
	// A private device key: a generation shared with running VMs would have
	// their pages cached already, and a cached page is never read, so it
	// would be missing from the trace.
	inst, err := r.Restorer.Restore(ctx, src, restore.Options{
		Device:    r.Device,
		IOEngine:  r.IOEngine,
		Prefetch:  restore.ModeOff,
		Trace:     true,
		DeviceKey: "record-" + id,
	})
	if err != nil {
		// A deletion meanwhile takes the artifacts away under the
		// restore, which then fails on the missing memory file.
		return res, r.discardOr(ctx, id, fmt.Errorf("record manifest %s: restore: %w", id, err))
	}
	res.ReadyAfter = inst.Timings.Ready
	touches := inst.Trace
	if err := inst.Stop(context.WithoutCancel(ctx)); err != nil {
		return res, fmt.Errorf("record manifest %s: %w", id, err)
	}
	offsets := make([]int64, len(touches))
	for i, t := range touches {
		offsets[i] = t.Offset
	}
	m, err := manifest.Build(src.Layout, offsets)
	if err != nil {
		return res, fmt.Errorf("record manifest %s: build: %w", id, err)
	}
	data, err := manifest.Encode(m)
	if err != nil {
		return res, fmt.Errorf("record manifest %s: encode: %w", id, err)
	}
	desc, err := r.Repo.AttachManifest(ctx, lease, data)
	if err != nil {
		return res, r.discardOr(ctx, id, fmt.Errorf("record manifest %s: attach: %w", id, err))
	}
	res.Descriptor, res.Ranges, res.Bytes, res.Touches = desc, len(m.Ranges), m.TotalBytes(), len(touches)
	return res, nil
}

// discardOr marks the errors that mean the snapshot went away meanwhile:
// those that say so, and any failure of a snapshot whose record is gone.
func (r *Recorder) discardOr(ctx context.Context, id string, err error) error {
	if errors.Is(err, repository.ErrNotFound) || errors.Is(err, repository.ErrLeaseEnded) {
		return fmt.Errorf("%w: %w", ErrDiscarded, err)
	}
	if _, gerr := r.Repo.Get(context.WithoutCancel(ctx), id); errors.Is(gerr, repository.ErrNotFound) {
		return fmt.Errorf("%w: snapshot deleted: %w", ErrDiscarded, err)
	}
	return err
}

// Job is a recording running in the background.
type Job struct {
	done chan struct{}
	mu   sync.Mutex
	res  Result
	err  error
}

// Done is closed when the recording has ended and its lease is released.
func (j *Job) Done() <-chan struct{} { return j.done }

// Result returns the outcome once Done is closed.
func (j *Job) Result() (Result, error) {
	<-j.done
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.res, j.err
}

// Start records in the background and ends lease when done, whatever the
// outcome. The caller must not use lease afterwards.
func (r *Recorder) Start(ctx context.Context, lease repository.Lease) *Job {
	j := &Job{done: make(chan struct{})}
	go func() {
		defer close(j.done)
		if r.Log != nil {
			r.Log.Info("recording startup manifest", "snapshot", lease.SnapshotID())
		}
		res, err := r.Record(ctx, lease)
		if endErr := lease.End(); endErr != nil && err == nil {
			err = fmt.Errorf("record manifest %s: end lease: %w", lease.SnapshotID(), endErr)
		}
		j.mu.Lock()
		j.res, j.err = res, err
		j.mu.Unlock()
		if r.Log == nil {
			return
		}
		switch {
		case errors.Is(err, ErrDiscarded):
			r.Log.Info("startup manifest recording discarded", "snapshot", lease.SnapshotID(), "reason", err)
		case err != nil:
			r.Log.Error("startup manifest recording failed", "snapshot", lease.SnapshotID(), "err", err)
		default:
			r.Log.Info("startup manifest attached", "snapshot", res.SnapshotID, "sha256", res.Descriptor.SHA256,
				"ranges", res.Ranges, "bytes", res.Bytes)
		}
	}()
	return j
}
