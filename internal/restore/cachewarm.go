package restore

import (
	"sync"

	"warmstart/internal/manifest"
	"warmstart/internal/repository"
)

// streamStartup starts streaming the source's startup pack at the very
// start of a restore that may prefetch. A cold node's floor is the wire
// time of the startup set, so the wire starts before the device is
// acquired, the manifest validated and the VMM started; the frames check
// themselves against their digests, so nothing of that is needed first.
// If the restore then does not prefetch, run stops it. It reports whether
// a stream started.
func (s *sequence) streamStartup() bool {
	w, ok := repository.Capabilities(s.src.Memory).(CacheWarmer)
	if !ok || !s.meansToPrefetch() {
		return false
	}
	warm, err := w.StreamStartup()
	if err != nil {
		s.logWarmFailure(err)
		return false
	}
	if warm == nil {
		return false
	}
	s.setWarm(warm)
	return true
}

// startCacheWarm starts warming the memory source's cache with m's ranges
// when the source has a cache and is not streaming its startup set yet. A
// failure to start only means the device prefetch and the guest fetch on
// demand.
func (s *sequence) startCacheWarm(m *manifest.Manifest) {
	w, ok := repository.Capabilities(s.src.Memory).(CacheWarmer)
	if !ok || s.warm != nil {
		return
	}
	warm, err := w.WarmCache(m.Ranges)
	if err != nil {
		s.logWarmFailure(err)
		return
	}
	s.setWarm(warm)
}

// setWarm keeps w, which the stop (or run, when nothing will use it)
// stops once.
func (s *sequence) setWarm(w repository.CacheWarm) {
	s.warm = w
	s.held.stopWarm = sync.OnceFunc(w.Stop)
}

func (s *sequence) logWarmFailure(err error) {
	if s.r.Log != nil {
		s.r.Log.Warn("cache prefetch not started", "snapshot", s.src.SnapshotID, "err", err)
	}
}

// noteStreamArrival records, at ready, when the cache prefetch's first
// block arrived and when it ended, if it did by then.
func (s *sequence) noteStreamArrival() {
	if s.warm == nil {
		return
	}
	first, ended := s.warm.Arrival()
	if !first.IsZero() {
		s.inst.Timings.StreamFirstBlock = first.Sub(s.t0)
	}
	if !ended.IsZero() {
		s.inst.Timings.StreamEnded = ended.Sub(s.t0)
	}
}
