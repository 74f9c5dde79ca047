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
	"math"
	"sync"
	"time"

	"warmstart/internal/manifest"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// TraceReadAheadBytes is the readahead window of the recorder's FUSE mount:
// one page, so that every read request is a page the guest touched. With
// the serving mount's window (128 KiB) each fault would also record the
// neighbours the kernel reads around it, and the manifest of the reference
// snapshot would cover 120 MiB for a 40 MiB working set.
const TraceReadAheadBytes = 4096

// Recorder records startup manifests, on a restorer of its own whose file
// device reads with TraceReadAheadBytes (node.TracingOptions).
type Recorder struct {
	Repo     repository.Repository
	Restorer *restore.Restorer
	// Device and IOEngine are the memory device the throwaway instance uses.
	Device   string
	IOEngine int
	Log      *slog.Logger
	// Timeout bounds each traced restore; a guest that never becomes
	// ready must not hold the capture lease forever.
	Timeout time.Duration
	// Recordings is how many traced restores a recording makes, one after
	// the other under the same lease: 2 keeps the pages both touched
	// ([manifest] recordings); below 2 means one.
	Recordings int
}

// Result is what one recording produced.
type Result struct {
	SnapshotID string                        `json:"snapshot_id"`
	Descriptor repository.ManifestDescriptor `json:"descriptor"`
	Ranges     int                           `json:"ranges"`
	Bytes      int64                         `json:"bytes"`
	// Touches is the first run's distinct touched pages.
	Touches    int           `json:"touches"`
	ReadyAfter time.Duration `json:"ready_after_ns"`
	// Recording is what went into the record: the runs the manifest
	// comes from and how much two of them agreed.
	Recording repository.Recording `json:"recording"`
	// Agreement is the comparison of two runs in full; nil when only one
	// ran to ready.
	Agreement *Agreement `json:"agreement,omitempty"`
	// Fallback says why a two-run recording attached the first run's
	// manifest ("" when it did not).
	Fallback string `json:"fallback,omitempty"`
}

// Agreement is manifest.Agreement for JSON: the rank correlation is
// absent where undefined, since JSON has no NaN.
type Agreement struct {
	PagesFirst      int      `json:"pages_first"`
	PagesSecond     int      `json:"pages_second"`
	Common          int      `json:"common"`
	Overlap         float64  `json:"overlap"`
	CoverFirst      float64  `json:"cover_first"`
	CoverSecond     float64  `json:"cover_second"`
	RankCorrelation *float64 `json:"rank_correlation,omitempty"`
}

// ErrDiscarded reports a recording whose snapshot was deleted, or whose
// lease ended, before the manifest could be attached.
var ErrDiscarded = errors.New("recording discarded")

// Record restores the leased snapshot with tracing (Recordings times),
// builds its manifest and attaches it. It does not end the lease.
func (r *Recorder) Record(ctx context.Context, lease repository.Lease) (Result, error) {
	id := lease.SnapshotID()
	res := Result{SnapshotID: id}
	resolved, err := r.resolve(ctx, id)
	if err != nil {
		return res, r.discardOr(ctx, id, fmt.Errorf("record manifest %s: resolve: %w", id, err))
	}
	src := restore.SourceIn(ctx, r.Repo, resolved)
	first, err := r.traceOnce(ctx, src, 1)
	if err != nil {
		return res, r.discardOr(ctx, id, fmt.Errorf("record manifest %s: %w", id, err))
	}
	res.ReadyAfter, res.Touches = first.ready, len(first.offsets)
	m, err := r.manifestOf(ctx, src, first, &res)
	if err != nil {
		return res, r.discardOr(ctx, id, fmt.Errorf("record manifest %s: %w", id, err))
	}
	data, err := manifest.Encode(m)
	if err != nil {
		return res, fmt.Errorf("record manifest %s: encode: %w", id, err)
	}
	desc, err := r.attach(ctx, lease, data, &res.Recording)
	if err != nil {
		return res, r.discardOr(ctx, id, fmt.Errorf("record manifest %s: attach: %w", id, err))
	}
	res.Descriptor, res.Ranges, res.Bytes = desc, len(m.Ranges), m.TotalBytes()
	return res, nil
}

func (r *Recorder) attach(ctx context.Context, lease repository.Lease, data []byte, rec *repository.Recording) (repository.ManifestDescriptor, error) {
	ctx, cancel := r.runContext(ctx)
	defer cancel()
	return r.Repo.AttachManifest(ctx, lease, data, rec)
}

func (r *Recorder) resolve(ctx context.Context, id string) (repository.Resolved, error) {
	ctx, cancel := r.runContext(ctx)
	defer cancel()
	return r.Repo.Resolve(ctx, id)
}

// runContext bounds one step by Timeout.
func (r *Recorder) runContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.Timeout > 0 {
		return context.WithTimeout(ctx, r.Timeout)
	}
	return context.WithCancel(ctx)
}

// run is one traced restore: its first touches until ready.
type run struct {
	offsets []int64
	ready   time.Duration
}

// traceOnce restores src once with tracing and stops it.
func (r *Recorder) traceOnce(ctx context.Context, src restore.Source, n int) (run, error) {
	ctx, cancel := r.runContext(ctx)
	defer cancel()
	// A private device key per run: a generation shared with running VMs,
	// or with the previous run, would have pages cached already, and a
	// cached page is never read, so it would be missing from the trace.
	inst, err := r.Restorer.Restore(ctx, src, restore.Options{
		Device:    r.Device,
		IOEngine:  r.IOEngine,
		Prefetch:  restore.ModeOff,
		Trace:     true,
		DeviceKey: fmt.Sprintf("record-%s-%d", src.SnapshotID, n),
	})
	if err != nil {
		// A deletion meanwhile takes the artifacts away under the
		// restore, which then fails on the missing memory file.
		return run{}, fmt.Errorf("restore %d: %w", n, err)
	}
	out := run{ready: inst.Timings.Ready, offsets: make([]int64, len(inst.Trace))}
	for i, t := range inst.Trace {
		out.offsets[i] = t.Offset
	}
	if err := inst.Stop(context.WithoutCancel(ctx)); err != nil {
		return run{}, fmt.Errorf("stop restore %d: %w", n, err)
	}
	return out, nil
}

// manifestOf builds the manifest from the first run alone, or from the
// pages it and a second run both touched. A second run that fails, or
// that shares no page with the first, leaves the first run's manifest: a
// recording is not lost to a flaky rerun. Only a deletion meanwhile
// (ErrDiscarded, from the attach that follows) ends it.
func (r *Recorder) manifestOf(ctx context.Context, src restore.Source, first run, res *Result) (*manifest.Manifest, error) {
	res.Recording = repository.Recording{Runs: 1}
	if r.Recordings < 2 {
		return buildOne(src, first)
	}
	second, err := r.traceOnce(ctx, src, 2)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		res.Fallback = fmt.Sprintf("second run failed: %v", err)
		r.warn("second recording run failed; attaching the first run's manifest", src.SnapshotID, err)
		return buildOne(src, first)
	}
	m, agr, err := manifest.Intersect(src.Layout, first.offsets, second.offsets)
	res.Agreement = agreementOf(agr)
	res.Recording.Overlap = &res.Agreement.Overlap
	if errors.Is(err, manifest.ErrNoCommonPages) {
		res.Fallback = "the two runs touched no page in common"
		r.warn("recording runs share no page; attaching the first run's manifest", src.SnapshotID, err)
		return buildOne(src, first)
	}
	if err != nil {
		return nil, fmt.Errorf("intersect runs: %w", err)
	}
	res.Recording.Runs, res.Recording.RankCorrelation = 2, res.Agreement.RankCorrelation
	return m, nil
}

func buildOne(src restore.Source, one run) (*manifest.Manifest, error) {
	m, err := manifest.Build(src.Layout, one.offsets)
	if err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	return m, nil
}

func agreementOf(g manifest.Agreement) *Agreement {
	a := &Agreement{PagesFirst: g.PagesA, PagesSecond: g.PagesB, Common: g.Common,
		Overlap: g.Overlap, CoverFirst: g.CoverA, CoverSecond: g.CoverB}
	if rho := g.RankCorrelation; !math.IsNaN(rho) {
		a.RankCorrelation = &rho
	}
	return a
}

func (r *Recorder) warn(msg, id string, err error) {
	if r.Log != nil {
		r.Log.Warn(msg, "snapshot", id, "err", err)
	}
}

// discardOr marks the errors that mean the snapshot went away meanwhile:
// those that say so, and any failure of a snapshot whose record is gone.
func (r *Recorder) discardOr(ctx context.Context, id string, err error) error {
	if errors.Is(err, repository.ErrNotFound) || errors.Is(err, repository.ErrLeaseEnded) {
		return fmt.Errorf("%w: %w", ErrDiscarded, err)
	}
	if restore.DeletedFrom(ctx, r.Repo, id)() {
		// The failure is the deletion's doing, whatever it looked like
		// (a size check of an artifact that went away can read as
		// ErrIntegrity): keep its text, not its sentinels, so nothing
		// classifies a discarded recording as a damaged snapshot.
		return fmt.Errorf("%w: snapshot deleted: %v", ErrDiscarded, err)
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
		case errors.Is(err, context.Canceled) && ctx.Err() != nil:
			// Its owner is shutting down: nothing failed, and a daemon
			// records the snapshot again when it next starts.
			r.Log.Info("startup manifest recording stopped", "snapshot", lease.SnapshotID(), "reason", context.Cause(ctx), "err", err)
		case err != nil:
			r.Log.Error("startup manifest recording failed", "snapshot", lease.SnapshotID(), "err", err)
		default:
			r.Log.Info("startup manifest attached", "snapshot", res.SnapshotID, "sha256", res.Descriptor.SHA256,
				"ranges", res.Ranges, "bytes", res.Bytes, res.RecordingAttr())
		}
	}()
	return j
}

// RecordingAttr is the log group saying how the manifest was recorded:
// its runs, how they agreed, and why the first run's manifest was kept.
func (res Result) RecordingAttr() slog.Attr {
	attrs := []any{"runs", res.Recording.Runs}
	if a := res.Agreement; a != nil {
		attrs = append(attrs, "overlap", a.Overlap, "cover_first", a.CoverFirst, "cover_second", a.CoverSecond)
		if a.RankCorrelation != nil {
			attrs = append(attrs, "rank_correlation", *a.RankCorrelation)
		}
	}
	if res.Fallback != "" {
		attrs = append(attrs, "fallback", res.Fallback)
	}
	return slog.Group("recording", attrs...)
}
