package restore

import (
	"context"
	"errors"
	"fmt"
	"os"

	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/untrusted"
)

// prefetchPlan is a validated manifest and its digest; m is nil when the
// restore does not prefetch.
type prefetchPlan struct {
	m      *manifest.Manifest
	digest string
}

// meansToPrefetch says, before the device is acquired, whether the
// restore will prefetch if its manifest then validates: what planPrefetch
// decides without reading the manifest.
func (s *sequence) meansToPrefetch() bool {
	return s.quietSkip() == "" && s.cannotPrefetch() == nil
}

// quietSkip is why the restore does not prefetch, by its options and its
// snapshot alone; "" when it may. None of these is worth a log line.
func (s *sequence) quietSkip() string {
	switch {
	case s.opts.Prefetch == ModeOff:
		return "prefetch off"
	case s.opts.Prefetch == ModeAuto && !s.r.ConsumeEnabled:
		return "prefetch.on_restore is off"
	case s.src.Manifest == nil:
		return "snapshot has no startup manifest"
	}
	return ""
}

// cannotPrefetch is why the restore's device cannot prefetch it
// (memdev.PrefetchChecker), nil when it can.
func (s *sequence) cannotPrefetch() error {
	if c, ok := s.op.(memdev.PrefetchChecker); ok {
		return c.CheckPrefetch(memdev.Request{IOEngine: s.opts.IOEngine})
	}
	return nil
}

// planPrefetch decides whether this restore prefetches and returns the
// validated manifest and its digest, or none, with the reason in the
// prefetch report.
func (s *sequence) planPrefetch() prefetchPlan {
	r, src, rep := s.r, s.src, &s.inst.Prefetch
	if why := s.quietSkip(); why != "" {
		r.skipQuiet(rep, why)
		return prefetchPlan{}
	}
	if err := s.cannotPrefetch(); err != nil {
		r.skip(rep, src.SnapshotID, err.Error())
		return prefetchPlan{}
	}
	if m, digest := r.refinedManifest(src, rep); m != nil {
		return prefetchPlan{m, digest}
	}
	data, err := manifest.ReadFile(src.ManifestPath)
	if err == nil {
		var m *manifest.Manifest
		m, err = manifest.Verify(data, *src.Manifest, src.Layout)
		if err == nil {
			rep.Manifest = ManifestRecorded
			return prefetchPlan{m, src.Manifest.SHA256}
		}
	}
	reason := reasonOf(err)
	if r.Observe != nil {
		r.Observe.ManifestRejected(reason)
	}
	r.skip(rep, src.SnapshotID, fmt.Sprintf("manifest rejected (%s): %v", reason, err))
	return prefetchPlan{}
}

// startPrefetch joins the prefetch task of the device and manifest, and
// with wait, waits for it to finish. A device that cannot prefetch means
// on-demand reads, with a log line.
func (s *sequence) startPrefetch(ctx context.Context, wait bool) error {
	p, pp, rep := s.opts.Policy, s.plan, &s.inst.Prefetch
	trimmed, trims := prefetchable(s.src, pp.m)
	// A source that trims keeps prefetch to what it holds cheaply: no gaps.
	plan := p.Plan(trimmed, !trims)
	rep.PlannedBytes = pp.m.TotalBytes()
	rep.LeftToDemandBytes = pp.m.TotalBytes() - trimmed.TotalBytes()
	rep.Generation, rep.Digest = s.inst.Generation, pp.digest
	s.startCacheWarm(pp.m)
	target, onEnd, err := s.held.dev.Target(plan, memdev.TargetOptions{Fill: p.Fill, Hint: p.Hint})
	if err != nil {
		s.r.skip(rep, s.src.SnapshotID, err.Error())
		return nil
	}
	id := s.held.dev.ID()
	key := prefetch.Key{Device: id.Kind, Generation: id.Generation, Digest: pp.digest}
	sub := s.r.Engine.Join(key, target, plan, p.TaskOptions())
	s.held.sub = sub
	if !trims {
		// The task joined may be another restore's, with its own plan.
		rep.GapBytes = max(0, sub.PlanBytes()-trimmed.TotalBytes())
	}
	// When Join found a running task, target is unused and onEnd frees it
	// with that task.
	s.guest.follow(sub, onEnd)
	if wait {
		if err := sub.Wait(ctx); err != nil && ctx.Err() != nil {
			return fmt.Errorf("prefetch before start: %w", err)
		}
	}
	return nil
}

// reasonOf names a manifest validation failure for logs and metrics.
func reasonOf(err error) string {
	for _, c := range []struct {
		err  error
		name string
	}{
		{os.ErrNotExist, "missing"},
		{untrusted.ErrNotRegular, "not_regular"},
		{manifest.ErrSizeMismatch, "size"},
		{manifest.ErrDigestMismatch, "digest"},
		{manifest.ErrLayoutMismatch, "layout"},
		{manifest.ErrOversize, "oversize"},
	} {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	for _, format := range []error{
		manifest.ErrTruncated, manifest.ErrTrailingData, manifest.ErrBadMagic, manifest.ErrUnsupportedVersion,
		manifest.ErrOverlap, manifest.ErrUnaligned, manifest.ErrOutsideLayout, layout.ErrInvalid,
	} {
		if errors.Is(err, format) {
			return "corrupt"
		}
	}
	// Anything else failed to read the file at all (EIO, EACCES).
	return "unreadable"
}

func (r *Restorer) skipQuiet(rep *PrefetchReport, reason string) {
	rep.State, rep.Reason = "skipped", reason
	if r.Observe != nil {
		r.Observe.PrefetchSkipped(reason)
	}
}

// skip records a skip worth an operator's attention: one log line naming
// the snapshot and the reason.
func (r *Restorer) skip(rep *PrefetchReport, snapshot, reason string) {
	r.skipQuiet(rep, reason)
	if r.Log != nil {
		r.Log.Warn("startup prefetch skipped; restoring with on-demand reads", "snapshot", snapshot, "reason", reason)
	}
}
