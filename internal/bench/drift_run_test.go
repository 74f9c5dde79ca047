package bench

import (
	"context"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/trace"
)

// TestDriftingRunPlaysAVariantPerTrial runs the protocol on the reference
// snapshot with drift, on the uffd device, where a fault is exactly one
// touched page: every trial plays its own variant against the manifest
// recorded from the base trace, the replay VMM's hash matches the one
// computed for that variant, and each trial's startup-set accounting is
// exactly what the variant and the manifest say.
func TestDriftingRunPlaysAVariantPerTrial(t *testing.T) {
	ctx := context.Background()
	o := Options{Device: config.DeviceUffd, Blocks: 1, ReserveBlocks: 1, Seed: 3, Policies: []string{"warmstart"},
		Drift: 0.2, WorkDir: t.TempDir(), Progress: t.Output()}
	if err := UseReference(ctx, &o, 8<<20); err != nil {
		t.Fatal(err)
	}
	base := pageSet(t, o.TracePath)
	set := manifestPages(t, o)
	if len(set) != len(base) || len(minus(set, base)) != 0 {
		t.Fatalf("the manifest holds %d pages, %d of them outside the base trace's %d", len(set), len(minus(set, base)), len(base))
	}
	var ended []TrialResult
	o.OnTrial = func(res TrialResult) { ended = append(ended, res) }
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Summary.AllHashesOK || rep.Options.Drift != 0.2 {
		t.Fatalf("hashes ok %v, drift %v", rep.Summary.AllHashesOK, rep.Options.Drift)
	}
	checkVariantTrials(t, o, ended, set)
	for _, res := range rep.Trials {
		if res.Events != nil {
			t.Errorf("the report keeps %d events of %s", len(res.Events), res.Spec.Condition)
		}
	}
	if cell := cellOf(t, rep.Summary, Condition{CacheCold, "warmstart"}); cell.StartupSet.MissedPages == 0 {
		t.Errorf("no page missed under drift: %+v", cell.StartupSet)
	}
}

// checkVariantTrials checks that each trial played a variant of its own,
// read the right bytes and accounted for them exactly.
func checkVariantTrials(t *testing.T, o Options, ended []TrialResult, set map[int64]bool) {
	t.Helper()
	variants := map[int]bool{}
	for _, res := range ended {
		spec := res.Spec
		if spec.Variant < 1 || variants[spec.Variant] || spec.TracePath != o.Variants[spec.Variant-1] {
			t.Fatalf("%s played %s (variant %d); variants so far %v", spec.Condition, spec.TracePath, spec.Variant, variants)
		}
		variants[spec.Variant] = true
		if !res.Admitted {
			continue
		}
		if !res.HashOK || len(res.Events) == 0 {
			t.Errorf("%s: hash ok %v, %d device events", spec.Condition, res.HashOK, len(res.Events))
		}
		checkAccounting(t, res, set, pageSet(t, spec.TracePath))
	}
}

// checkAccounting compares a uffd trial's accounting with the pages the
// variant touches (played) and the manifest holds (set).
func checkAccounting(t *testing.T, res TrialResult, set, played map[int64]bool) {
	t.Helper()
	got := res.StartupSet
	missed := int64(len(minus(played, set)))
	if res.Spec.Condition.Prefetch != PrefetchOff {
		// The warmstart plan takes small gaps between recorded pages
		// along: a page so brought in before the guest asked is not
		// missed. Every played page outside the set that the guest
		// asked for by ready is.
		missed = demandedBy(res, minus(played, set))
	}
	if got.MissedPages != missed || got.StartupSetPages != int64(len(set)) ||
		got.InTimePages+got.LatePages+got.UnusedPages != got.StartupSetPages {
		t.Errorf("%s: %+v; want %d missed pages of a %d-page set", res.Spec.Condition, got, missed, len(set))
	}
	if res.Spec.Condition.Prefetch != PrefetchOff {
		return
	}
	late, unused := int64(len(set)-len(minus(set, played))), int64(len(minus(set, played)))
	if got.LatePages != late || got.UnusedPages != unused || got.InTimePages != 0 {
		t.Errorf("%s: %+v; want %d late and %d unused", res.Spec.Condition, got, late, unused)
	}
	for _, e := range res.Events {
		if e.Kind != memdev.Demand {
			t.Fatalf("%s: a %v event without prefetch", res.Spec.Condition, e.Kind)
		}
	}
}

// demandedBy counts the pages the trial's guest asked its device for by
// ready.
func demandedBy(res TrialResult, pages map[int64]bool) int64 {
	asked := map[int64]bool{}
	for _, e := range res.Events {
		if e.Kind != memdev.Demand || !e.ByReady(res.Timings.Ready) {
			continue
		}
		for p := e.Offset / trace.PageBytes; p*trace.PageBytes < e.Offset+int64(e.Length); p++ {
			if pages[p] {
				asked[p] = true
			}
		}
	}
	return int64(len(asked))
}

func pageSet(t *testing.T, path string) map[int64]bool {
	t.Helper()
	entries, err := trace.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	set := map[int64]bool{}
	for _, e := range entries {
		set[e.Offset/trace.PageBytes] = true
	}
	return set
}

func manifestPages(t *testing.T, o Options) map[int64]bool {
	t.Helper()
	data, err := manifest.ReadFile(o.Source.ManifestPath)
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Verify(data, *o.Source.Manifest, o.Source.Layout)
	if err != nil {
		t.Fatal(err)
	}
	set := map[int64]bool{}
	for _, r := range m.Ranges {
		for off := r.Offset; off < r.End(); off += trace.PageBytes {
			set[off/trace.PageBytes] = true
		}
	}
	return set
}

// minus is the pages of a not in b.
func minus(a, b map[int64]bool) map[int64]bool {
	out := map[int64]bool{}
	for p := range a {
		if !b[p] {
			out[p] = true
		}
	}
	return out
}
