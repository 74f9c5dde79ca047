package s3

import (
	"context"
	"sort"

	"warmstart/internal/chunkmap"
	"warmstart/internal/manifest"
	"warmstart/internal/repository"
)

// The refined pack. A restore with refine on prefetches the snapshot's
// refined manifest (the learner attaches one after every restore), whose
// learned pages lie anywhere in memory: read from the chunks, each costs a
// whole chunk, so a cold node prefetching a refinement through the
// recorded manifest's pack fetched most of the memory before ready. A
// refinement attach therefore names a pack of the refined set too, the
// record's refined_pack, which a restore streams instead of the recorded
// one.
//
// Bounded work: the learner attaches after every restore and a pack is
// tens of MiB, so a refinement keeps the pack the record already streams
// (the refined pack, else the recorded one) while that pack still holds
// the refined set closely: a new pack is built only when more than 1/64
// of the refined set lies outside it (pages a restore would leave to
// demand faults, each a whole chunk) or more than 1/8 of the pack is
// pages the refinement dropped (streamed for nothing before ready). A
// guest whose start-up keeps drifting crosses those thresholds at every
// restore, so a refined pack is also kept until its refinement has
// learned from refinedPackMinRestores more restores: at most one pack
// upload per that many attaches, whatever the guest does. A refined
// pack's index is self-describing (format 2: the memory ranges it holds,
// in pack order), so a pack built from an older refinement serves a newer
// one: its pages from the pack, the others left to demand (the memory
// source's PrefetchRanges). An attach that keeps the pack uploads nothing
// more than the refinement; one that rebuilds uploads the refined set
// once, compressed (the README has the figures).
const (
	refinedPackUncoveredDivisor = 64
	refinedPackWasteDivisor     = 8
	refinedPackMinRestores      = 8
)

// refinedPackFor is the refined pack the record names once the refinement
// a is attached: the current one when the pack streamed now still holds
// the refined set closely enough, else a new one built from it. A failure
// to build leaves the current one: correct, only slower.
func (r *Repo) refinedPackFor(ctx context.Context, rec repository.Record, a repository.Attachment) *repository.StartupPackDescriptor {
	if d := rec.RefinedPack; d != nil && tooSoon(d.Restores, a.RefinementDescriptor().Restores) {
		return d
	}
	mdata := a.RefinedManifest()
	m, err := manifest.Decode(mdata)
	if err != nil || m.TotalBytes() <= 0 || m.TotalBytes() > maxPackLogicalBytes {
		return rec.RefinedPack // a restore refuses such a manifest as well
	}
	cur := r.currentPack(ctx, rec)
	if cur != nil && closeEnough(cur, m) {
		return rec.RefinedPack
	}
	msum := chunkmap.Sum(mdata)
	if d := rec.RefinedPack; d != nil && d.ManifestSHA256 == msum.String() {
		return d // its objects are published: never rewritten
	}
	d, err := r.buildRefinedPack(ctx, rec, cur, m, msum)
	if err != nil {
		return rec.RefinedPack
	}
	d.Restores = a.RefinementDescriptor().Restores
	return d
}

// buildRefinedPack reads m's pages (whose encoding has the SHA-256 msum)
// from rec's memory and stores them as a refined pack with a format-2
// index. cur is the pack streamed now, nil when none loads.
func (r *Repo) buildRefinedPack(ctx context.Context, rec repository.Record, cur *packSource, m *manifest.Manifest, msum chunkmap.Digest) (*repository.StartupPackDescriptor, error) {
	if r.beforeRefinedPack != nil {
		if err := r.beforeRefinedPack(); err != nil {
			return nil, err
		}
	}
	// The set's pages come from the pack streamed now where it holds them:
	// the learner's node restored with it, so they are in its cache.
	src, err := r.packReadSource(ctx, rec, cur, nil)
	if err != nil {
		return nil, err
	}
	logical, err := readPackContents(src, m)
	if err != nil {
		return nil, err
	}
	obj, idx := chunkmap.BuildPack(msum, logical, chunkmap.DefaultFrameBytes, packRanges(m)...)
	objKey, indexKey := refinedPackKeys(r.keys, rec.ID, msum.String())
	return r.storePack(ctx, objKey, indexKey, obj, idx)
}

// tooSoon reports whether a refinement that has learned from restores is
// too close to the one a pack was built at (built) for a new pack. A
// count below built (a learner that started over) is not too soon: the
// pack's count says nothing of it.
func tooSoon(built, restores uint64) bool {
	return restores >= built && restores-built < refinedPackMinRestores
}

// currentPack is the pack a restore of rec streams now (streamedPack);
// nil when none loads.
func (r *Repo) currentPack(ctx context.Context, rec repository.Record) *packSource {
	manifestPath := func() string {
		if rec.Manifest == nil {
			return ""
		}
		path, err := r.fetchLocal(ctx, r.keys.artifact(rec.ID, repository.ManifestFileName), rec.Manifest.SHA256, rec.Manifest.Size)
		if err != nil {
			return ""
		}
		return path
	}
	return r.streamedPack(ctx, rec, manifestPath, func(error) {})
}

// closeEnough reports whether pack still holds m's pages closely enough to
// be streamed for it (see the thresholds above).
func closeEnough(pack *packSource, m *manifest.Manifest) bool {
	var covered int64
	for _, rg := range m.Ranges {
		for _, pc := range cutBySpans(pack.spans, rg.Offset, rg.End()) {
			if pc.fromPack {
				covered += pc.length
			}
		}
	}
	uncovered, waste := m.TotalBytes()-covered, pack.obj.Size-covered
	return uncovered*refinedPackUncoveredDivisor <= m.TotalBytes() && waste*refinedPackWasteDivisor <= pack.obj.Size
}

// cutBySpans cuts memory [off, end) into runs the spans (sorted by memory
// offset) hold, fromPack with their pack offset, and gaps between them.
func cutBySpans(spans []packSpan, off, end int64) []piece {
	var out []piece
	pos := off
	i := sort.Search(len(spans), func(i int) bool { return spans[i].end() > pos })
	for pos < end {
		next := end
		if i < len(spans) {
			next = min(end, spans[i].memOff)
		}
		if pos < next {
			out = append(out, piece{memOff: pos, length: next - pos})
			pos = next
			continue
		}
		s := spans[i]
		stop := min(end, s.end())
		out = append(out, piece{memOff: pos, length: stop - pos, packOff: s.packOff + pos - s.memOff, fromPack: true})
		pos = stop
		i++
	}
	return out
}

// removeSupersededPacks removes, best effort once the record after is
// durable, the pack objects the record before named and after no longer
// does. A restore on another node still streaming one then fails its
// GETs (the object is gone) and reads those pages from the chunks, which
// hold the same bytes; its frames are checked, so never other bytes.
func (r *Repo) removeSupersededPacks(ctx context.Context, id string, before, after repository.Record) {
	if d := before.StartupPack; d != nil && (after.StartupPack == nil || *after.StartupPack != *d) {
		obj, idx := packKeys(r.keys, id, d.ManifestSHA256)
		_ = r.remove(ctx, obj)
		_ = r.remove(ctx, idx)
	}
	if d := before.RefinedPack; d != nil && (after.RefinedPack == nil || after.RefinedPack.ManifestSHA256 != d.ManifestSHA256) {
		obj, idx := refinedPackKeys(r.keys, id, d.ManifestSHA256)
		_ = r.remove(ctx, obj)
		_ = r.remove(ctx, idx)
	}
}
