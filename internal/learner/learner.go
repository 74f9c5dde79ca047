// Package learner applies what restores observed to their snapshots'
// refined manifests, in the background after ready, never in a restore's
// timed path: for each observation it leases the snapshot, reads the
// current refinement (or starts from the recorded manifest), applies the
// observation (package refine) and attaches the result. One worker per
// process serialises the work, so two restores of one snapshot finishing
// at once are both applied; across processes the attach is a
// compare-and-swap under the record lock (repository.ErrStale), and a
// learner that lost the race reads again and redoes its step.
package learner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"warmstart/internal/manifest"
	"warmstart/internal/refine"
	"warmstart/internal/repository"
)

// QueueLength bounds the observations waiting to be applied. Learning is
// an optimisation: a burst of restores beyond it loses some lessons (with
// a log line) rather than holding memory or a restore.
const QueueLength = 64

// staleRetries is how often a step lost to another process is redone.
const staleRetries = 3

// Observed is one restore's lesson for a snapshot.
type Observed struct {
	SnapshotID  string
	Observation refine.Observation
}

// Learner applies observations in the background. Submit never blocks;
// Close stops it.
type Learner struct {
	repo repository.Repository
	log  *slog.Logger
	opts refine.Options

	queue  chan Observed
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	closed bool
	// applied is called after each observation was handled (tests).
	applied func(Observed, error)
}

// New starts a learner on repo. log may be nil.
func New(repo repository.Repository, log *slog.Logger, opts refine.Options) *Learner {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Learner{repo: repo, log: log, opts: opts, queue: make(chan Observed, QueueLength),
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go l.run()
	return l
}

// Submit queues one observation; it reports false when the queue is full
// or the learner closed, and the observation is dropped.
func (l *Learner) Submit(o Observed) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	select {
	case l.queue <- o:
		return true
	default:
		l.log.Warn("refinement queue full; observation dropped", "snapshot", o.SnapshotID)
		return false
	}
}

// AbandonAfter is how long Close waits, once ctx ended and the
// refinement in progress was cancelled, for it to return: a step that
// does not honour the cancellation (the end of a lease on a store that
// does not answer) is left running, and a stopping process does not wait
// for it.
const AbandonAfter = 2 * time.Second

// Close stops taking observations and applies those queued until ctx
// ends; then it abandons the rest (a repository call in progress is
// cancelled, and left running after AbandonAfter) and returns ctx's error.
func (l *Learner) Close(ctx context.Context) error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.queue)
	}
	l.mu.Unlock()
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
	}
	l.cancel()
	t := time.NewTimer(AbandonAfter)
	defer t.Stop()
	select {
	case <-l.done:
		return fmt.Errorf("refinement: %d observations abandoned: %w", len(l.queue), ctx.Err())
	case <-t.C:
		return fmt.Errorf("refinement: %d observations abandoned, one still running after %v: %w",
			len(l.queue), AbandonAfter, ctx.Err())
	}
}

func (l *Learner) run() {
	defer close(l.done)
	for o := range l.queue {
		if l.ctx.Err() != nil {
			continue
		}
		err := l.learn(o)
		if err != nil && l.ctx.Err() == nil {
			l.log.Warn("startup manifest not refined", "snapshot", o.SnapshotID, "error", err)
		}
		if l.applied != nil {
			l.applied(o, err)
		}
	}
}

// learn applies one observation, redoing it when another process
// refined the snapshot in between.
func (l *Learner) learn(o Observed) error {
	for range staleRetries {
		err := l.step(o)
		if !errors.Is(err, repository.ErrStale) {
			return err
		}
	}
	return fmt.Errorf("refinement kept changing under %d attempts", staleRetries)
}

// step is one read-apply-attach of o under a lease on its snapshot.
func (l *Learner) step(o Observed) error {
	ctx := l.ctx
	if held, err := l.repo.LeaseHeld(ctx, o.SnapshotID); err != nil || held {
		if err == nil {
			l.log.Info("refinement skipped: the snapshot's manifest is being recorded", "snapshot", o.SnapshotID)
		}
		return err
	}
	lease, err := l.repo.LeaseExisting(ctx, o.SnapshotID)
	if errors.Is(err, repository.ErrNotFound) {
		return nil // deleted since the restore: nothing to learn for
	}
	if err != nil {
		return err
	}
	defer lease.End()
	cur, err := l.current(ctx, o.SnapshotID)
	if err != nil || cur.base == nil {
		return err
	}
	res := cur.state.Apply(o.Observation, l.opts)
	_, data, err := cur.state.Manifest(cur.rec.Layout)
	if err != nil {
		return err
	}
	enc, err := cur.state.Encode()
	if err != nil {
		return err
	}
	d, err := l.repo.AttachRefinement(ctx, lease, repository.Refinement{BaseSHA256: cur.state.BaseSHA256,
		PreviousSHA256: cur.previous, Restores: cur.state.Restores, Pages: int64(len(cur.state.Pages)),
		Manifest: data, State: enc})
	if err != nil {
		return err
	}
	l.log.Info("startup manifest refined", "snapshot", o.SnapshotID, "restores", d.Restores, "pages", d.Pages,
		"added", res.Added, "aged_out", res.AgedOut, "evicted", res.Evicted, "moved", res.Moved,
		"late", res.Late, "missed", res.Missed, "digest_before", cur.digest, "digest_after", d.ManifestSHA256)
	return nil
}

// current is a snapshot's state to learn on.
type current struct {
	rec   repository.Record
	base  *manifest.Manifest
	state refine.State
	// previous is the refinement file the state came from ("" none);
	// digest the manifest restores prefetched from it.
	previous, digest string
}

// current reads the snapshot's refinement, or starts from its recorded
// manifest when it has none or it cannot be read (base nil: no manifest,
// nothing to learn).
func (l *Learner) current(ctx context.Context, id string) (current, error) {
	res, err := l.repo.Resolve(ctx, id)
	if errors.Is(err, repository.ErrNotFound) {
		return current{}, nil
	}
	if err != nil {
		return current{}, err
	}
	rec := res.Record
	if rec.Manifest == nil {
		return current{}, nil
	}
	data, err := manifest.ReadFile(res.ManifestPath)
	if err != nil {
		return current{}, err
	}
	base, err := manifest.Verify(data, manifest.Descriptor{SHA256: rec.Manifest.SHA256, Size: rec.Manifest.Size}, rec.Layout)
	if err != nil {
		return current{}, err
	}
	cur := current{rec: rec, base: base, state: refine.Initial(base, rec.Manifest.SHA256), digest: rec.Manifest.SHA256}
	if d := rec.Refinement; d != nil {
		// The CAS names what the record has, even when it cannot be read:
		// an unreadable refinement is replaced by one grown afresh.
		cur.previous = d.SHA256
		if st, err := readState(res.RefinementPath, *d); err != nil {
			l.log.Warn("refinement unreadable; learning again from the recorded manifest", "snapshot", id, "error", err)
		} else {
			cur.state, cur.digest = st, d.ManifestSHA256
		}
	}
	return cur, nil
}

func readState(path string, d repository.RefinementDescriptor) (refine.State, error) {
	_, data, err := repository.ReadRefinement(path, d)
	if err != nil {
		return refine.State{}, err
	}
	st, err := refine.Decode(data)
	if err != nil {
		return refine.State{}, err
	}
	if st.BaseSHA256 != d.BaseSHA256 {
		return refine.State{}, fmt.Errorf("%w: state grew from %s, descriptor says %s", refine.ErrCorrupt, st.BaseSHA256, d.BaseSHA256)
	}
	return st, nil
}
