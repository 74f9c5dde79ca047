package bench

import (
	"context"
	"maps"
	"slices"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/restore"
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
	outside := minus(played, set)
	if got.StartupSetPages != int64(len(set)) || got.InTimePages+got.LatePages+got.UnusedPages != got.StartupSetPages {
		t.Errorf("%s: %+v; want a %d-page set, each page in time, late or unused", res.Spec.Condition, got, len(set))
	}
	if res.Spec.Condition.Prefetch != PrefetchOff {
		// The warmstart plan takes small gaps between recorded pages
		// along, so a played page outside the set is missed unless it
		// lies in such a gap (and prefetch got there first); on uffd
		// every other one faults.
		p, err := restore.LookupPolicy(res.Spec.Condition.Prefetch)
		if err != nil {
			t.Fatal(err)
		}
		most, least := int64(len(outside)), int64(len(minus(outside, gapsOf(set, p.GapBytes/trace.PageBytes))))
		if got.MissedPages > most || got.MissedPages < least {
			t.Errorf("%s: %d pages missed; want between %d (played outside the set and its small gaps) and %d (played outside the set)",
				res.Spec.Condition, got.MissedPages, least, most)
		}
		return
	}
	if got.MissedPages != int64(len(outside)) {
		t.Errorf("%s: %+v; want %d missed pages of a %d-page set", res.Spec.Condition, got, len(outside), len(set))
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

// gapsOf are the pages between two pages of set (neighbours in memory)
// at most maxGap pages apart.
func gapsOf(set map[int64]bool, maxGap int64) map[int64]bool {
	pages := slices.Sorted(maps.Keys(set))
	gaps := map[int64]bool{}
	for i := 0; i+1 < len(pages); i++ {
		if gap := pages[i+1] - pages[i] - 1; gap > 0 && gap <= maxGap {
			for p := pages[i] + 1; p < pages[i+1]; p++ {
				gaps[p] = true
			}
		}
	}
	return gaps
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
