package restore

import (
	"warmstart/internal/manifest"
	"warmstart/internal/refine"
	"warmstart/internal/startupset"
)

// Prefetch labels: whether a restore prefetched, as metrics and logs name it.
const (
	PrefetchLabelOn      = "on"
	PrefetchLabelOff     = "off"
	PrefetchLabelSkipped = "skipped"
)

// ReadyObserver, when the Restorer's Observer implements it, is told of
// every restore that reached ready, with its startup-set accounting.
type ReadyObserver interface {
	RestoreReady(o ReadyOutcome)
}

// ReadyOutcome is one restore at ready.
type ReadyOutcome struct {
	Device string
	// Prefetch is PrefetchLabelOn, PrefetchLabelOff or PrefetchLabelSkipped.
	Prefetch   string
	Policy     string
	Timings    Timings
	StartupSet startupset.Report
	// Events are what the memory device served until ready.
	Events []startupset.Event
}

// prefetchLabel says whether the restore prefetched.
func prefetchLabel(prefetched bool, opts Options) string {
	switch {
	case prefetched:
		return PrefetchLabelOn
	case opts.Prefetch == ModeOff:
		return PrefetchLabelOff
	}
	return PrefetchLabelSkipped
}

// account stops following the guest and classifies the startup set at
// ready. m is the manifest the restore prefetched; when it did not, the
// attached manifest is read again, outside the timed path, so that a
// restore without prefetch still says what it would have needed.
func (s *sequence) account(m *manifest.Manifest) {
	inst, g := s.inst, s.guest
	g.finish(s.held.dev)
	if m == nil {
		m = attachedManifest(s.src)
	}
	in := startupset.Input{
		Events:      g.timeline.Events(),
		Ready:       inst.Timings.Ready,
		PrefetchRan: g.sub != nil,
	}
	if m != nil {
		for _, r := range m.Ranges {
			in.StartupSet = append(in.StartupSet, startupset.Range{Offset: r.Offset, Length: r.Length})
		}
	}
	if in.PrefetchRan && inst.Prefetch.EndedAfter > 0 {
		in.PrefetchEnded = inst.Prefetch.EndedAfter
	}
	inst.StartupSet = startupset.Account(in)
	inst.Events = in.Events
	if g.sub != nil && !inst.Passthrough {
		obs := refine.FromEvents(m.Ranges, in.Events, in.Ready, s.touched())
		inst.Observation = &obs
	}
	inst.PrefetchLabel = prefetchLabel(g.sub != nil, s.opts)
	if o, ok := s.r.Observe.(ReadyObserver); ok {
		o.RestoreReady(ReadyOutcome{Device: s.op.Kind(), Prefetch: inst.PrefetchLabel, Policy: s.opts.Policy.Name,
			Timings: inst.Timings, StartupSet: inst.StartupSet, Events: inst.Events})
	}
}

// attachedManifest reads and checks the snapshot's manifest, or nil.
func attachedManifest(src Source) *manifest.Manifest {
	if src.Manifest == nil {
		return nil
	}
	data, err := manifest.ReadFile(src.ManifestPath)
	if err != nil {
		return nil
	}
	m, err := manifest.Verify(data, *src.Manifest, src.Layout)
	if err != nil {
		return nil
	}
	return m
}
