package restore_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/refine"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/trace"
)

// attachRefinement attaches, as the snapshot's refinement, its recorded
// manifest without the last dropped pages the guest's trace touches, and
// returns the refined manifest's digest and the dropped pages.
func (e *env) attachRefinement(t *testing.T, dropped int) (string, []int64) {
	t.Helper()
	src := e.source(t)
	st := refine.Initial(e.manifest(t), src.Manifest.SHA256)
	entries, err := trace.ReadFile(e.ref.paths.Trace)
	if err != nil {
		t.Fatal(err)
	}
	var gone []int64
	for i := len(entries) - 1; i >= 0 && len(gone) < dropped; i-- {
		if p := entries[i].Offset / refine.PageBytes; !slices.Contains(gone, p) {
			gone = append(gone, p)
		}
	}
	st.Pages = slices.DeleteFunc(st.Pages, func(p refine.Page) bool { return slices.Contains(gone, p.Page) })
	_, data, err := st.Manifest(src.Layout)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := st.Encode()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lease, err := e.repo.LeaseExisting(ctx, e.id)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	d, err := e.repo.AttachRefinement(ctx, lease, repository.Refinement{BaseSHA256: st.BaseSHA256,
		Restores: 1, Pages: int64(len(st.Pages)), Manifest: data, State: enc})
	if err != nil {
		t.Fatal(err)
	}
	return d.ManifestSHA256, gone
}

// TestRefinedManifestIsPrefetched: with refine on, a restore prefetches
// the snapshot's refined manifest (its digest is the task's key), and its
// observation names the pages the refinement lacks as missed; with refine
// off, the recorded manifest.
func TestRefinedManifestIsPrefetched(t *testing.T) {
	e := newEnv(t, envOptions{})
	refined, gone := e.attachRefinement(t, 10)
	src := e.source(t)
	r := *e.restorer
	r.Refine = true
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			inst := e.restore(t, &r, src, restore.Options{Device: device, Prefetch: restore.ModeOn, Policy: exactPolicy(t)})
			checkHash(t, inst, e.ref.expected)
			if p := inst.Prefetch; p.Manifest != restore.ManifestRefined || p.Digest != refined || p.Fallback != "" {
				t.Fatalf("prefetch %+v: want the refined manifest %s", p, refined)
			}
			if inst.Observation == nil {
				t.Fatal("a prefetching restore has no observation")
			}
			if device != config.DeviceUffd {
				return // the file device's readaround windows blur which page was missed
			}
			var missed []int64
			for _, d := range inst.Observation.Demands {
				if d.PlanIndex < 0 {
					missed = append(missed, d.Page)
				}
			}
			slices.Sort(missed)
			slices.Sort(gone)
			if !slices.Equal(missed, gone) {
				t.Fatalf("observed missed pages %v, want the %d the refinement dropped %v", missed, len(gone), gone)
			}
		})
	}
	inst := e.restore(t, e.restorer, src, restore.Options{Device: config.DeviceFile, Prefetch: restore.ModeOn})
	if p := inst.Prefetch; p.Manifest != restore.ManifestRecorded || p.Digest != src.Manifest.SHA256 {
		t.Fatalf("refine off: prefetch %+v, want the recorded manifest", p)
	}
}

// TestBrokenRefinementFallsBackToTheRecordedManifest: a refinement that
// is missing, damaged or not what the record says is not used; the
// recorded manifest is, and the report says why.
func TestBrokenRefinementFallsBackToTheRecordedManifest(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.attachRefinement(t, 10)
	good := e.source(t)
	data, err := os.ReadFile(good.RefinementPath)
	if err != nil {
		t.Fatal(err)
	}
	flipped := slices.Clone(data)
	flipped[20] ^= 1 // inside the refined manifest
	wrongSize := *good.Refinement
	wrongSize.ManifestSize--
	cases := []struct {
		name, reason string
		bytes        []byte
		desc         *repository.RefinementDescriptor
	}{
		{"missing", "missing", nil, good.Refinement},
		{"flipped byte", "digest", flipped, good.Refinement},
		{"descriptor of another size", "corrupt", data, &wrongSize},
	}
	r := *e.restorer
	r.Refine = true
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := good
			src.RefinementPath, src.Refinement = filepath.Join(t.TempDir(), "refinement"), c.desc
			if c.bytes != nil {
				if err := os.WriteFile(src.RefinementPath, c.bytes, 0o444); err != nil {
					t.Fatal(err)
				}
			}
			inst := e.restore(t, &r, src, restore.Options{Device: config.DeviceFile, Prefetch: restore.ModeOn})
			checkHash(t, inst, e.ref.expected)
			p := inst.Prefetch
			if p.Manifest != restore.ManifestRecorded || p.Digest != good.Manifest.SHA256 {
				t.Fatalf("prefetch %+v: want the recorded manifest", p)
			}
			if !strings.Contains(p.Fallback, "refined manifest rejected ("+c.reason+")") {
				t.Fatalf("fallback %q does not name reason %q", p.Fallback, c.reason)
			}
			if got := e.observer.lastRejected(); got != c.reason {
				t.Fatalf("observer told rejection %q, want %q", got, c.reason)
			}
		})
	}
}
