package restore

import (
	"warmstart/internal/manifest"
	"warmstart/internal/repository"
)

// A snapshot's memory is a memdev.Source that every device serves: a local
// file, or a remote store read through a node-local cache (the S3
// repository). What a source can do beyond serving bytes, a restore asks
// for with the capability interfaces below; none of them is a device's.

// CacheWarmer is a memory source with a node-local cache below the memory
// device (the S3 repository's chunk cache). When a restore prefetches, the
// source's executor fetches the startup set into that cache with its own
// bounded concurrency, and the device prefetch's and the guest's reads
// then hit that cache or wait on its fetches in flight.
type CacheWarmer interface {
	// StreamStartup starts streaming the startup set when the source keeps
	// it packed in a form that checks itself (the S3 startup pack: frames
	// named by their digests), so the stream needs nothing of the restore
	// and can begin before the device is acquired and the manifest
	// validated. It returns nil, nil when the source keeps no such pack.
	StreamStartup() (repository.CacheWarm, error)
	// WarmCache starts fetching the manifest's ranges, in first-touch
	// order, and returns at once.
	WarmCache(ranges []manifest.Range) (repository.CacheWarm, error)
}

// PrefetchTrimmer is a memory source on which prefetching some pages of a
// manifest costs far more than the pages (the S3 source: a page outside
// its startup pack costs a whole chunk GET). The device prefetch reads only
// the ranges it keeps; the others are left to demand faults, which fetch
// only what the guest touches.
type PrefetchTrimmer interface {
	PrefetchRanges(ranges []manifest.Range) []manifest.Range
}

// prefetchable is m as the device prefetch reads it from src's memory:
// trimmed by the source when it asks (PrefetchTrimmer, and trims is
// true), else m.
func prefetchable(src Source, m *manifest.Manifest) (_ *manifest.Manifest, trims bool) {
	t, ok := repository.Capabilities(src.Memory).(PrefetchTrimmer)
	if !ok {
		return m, false
	}
	return &manifest.Manifest{Layout: m.Layout, Ranges: t.PrefetchRanges(m.Ranges)}, true
}

// PackSkipper is a memory source that keeps its startup set in a pack and
// goes on without it, from its chunks, when the pack is missing, damaged
// or does not match the manifest: correct, but slower, so the restore
// says why.
type PackSkipper interface {
	// StartupPackSkipped is why the source went without its startup pack
	// so far; nil while it uses it, or when it has none.
	StartupPackSkipped() error
}

// notePackSkipped reports, at ready, why the memory source went without
// its startup pack, if it did: one warning and the prefetch report.
func (s *sequence) notePackSkipped() {
	p, ok := repository.Capabilities(s.src.Memory).(PackSkipper)
	if !ok {
		return
	}
	err := p.StartupPackSkipped()
	if err == nil {
		return
	}
	s.inst.Prefetch.StartupPackSkipped = err.Error()
	if s.r.Log != nil {
		s.r.Log.Warn("startup pack skipped", "snapshot", s.src.SnapshotID, "err", err)
	}
}

// ReadyNotifier is a memory source that wants to know when a restore of
// it is ready: its startup set is in, so background work on the node (the
// S3 chunk cache's fill of the rest of the memory) may start without
// competing with the restore's own fetches.
type ReadyNotifier interface {
	RestoreReady()
}

// noteReady tells src's memory source, if it asks, that a restore is ready.
func noteReady(src Source) {
	if n, ok := repository.Capabilities(src.Memory).(ReadyNotifier); ok {
		n.RestoreReady()
	}
}
