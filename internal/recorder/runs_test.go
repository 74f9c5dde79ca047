package recorder_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/manifest"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/trace"
)

// attachedManifest is the manifest the record of id names, verified.
func (e *env) attachedManifest(t *testing.T, id string) (*manifest.Manifest, repository.Record) {
	t.Helper()
	resolved, err := e.repo.Resolve(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	rec := resolved.Record
	if rec.Manifest == nil {
		t.Fatalf("snapshot %s has no manifest", id)
	}
	data, err := os.ReadFile(resolved.ManifestPath)
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Verify(data, manifest.Descriptor{SHA256: rec.Manifest.SHA256, Size: rec.Manifest.Size}, e.ref.layout)
	if err != nil {
		t.Fatal(err)
	}
	return m, rec
}

// TestTwoRunsKeepTheCommonPages: the replay VMM plays the same trace on
// every restore, so two runs agree completely: overlap 1, rank
// correlation 1, and on the uffd device (one fault, one page) the
// manifest is exactly the one-run manifest. The record, the result and
// the log say so. Each run gets a cold device generation of its own: a
// second run on the first one's page cache would trace nothing.
func TestTwoRunsKeepTheCommonPages(t *testing.T) {
	e := newEnv(t)
	want := traceManifest(t, e)
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			var starts atomic.Int32
			e.vm.setBeforeStart(func() { starts.Add(1) })
			defer e.vm.setBeforeStart(nil)
			id, lease := e.publish(t)
			rec := e.recorder(device)
			rec.Recordings = 2
			res, err := jobResult(t, rec.Start(context.Background(), lease))
			if err != nil {
				t.Fatal(err)
			}
			if n := starts.Load(); n != 2 {
				t.Errorf("%d traced restores, want 2", n)
			}
			a := res.Agreement
			if a == nil || res.Fallback != "" || res.Recording.Runs != 2 {
				t.Fatalf("result %+v: want two runs compared and no fallback", res)
			}
			if a.RankCorrelation == nil {
				t.Fatalf("no rank correlation over %d common pages", a.Common)
			}
			rho := *a.RankCorrelation
			t.Logf("%s: %d and %d pages, %d common, overlap %.4f, rank correlation %.6f",
				device, a.PagesFirst, a.PagesSecond, a.Common, a.Overlap, rho)
			// The file device's FUSE reads of one fault burst may arrive
			// in either order, so there the order is nearly, not exactly,
			// the same; the uffd device serves one fault at a time.
			wantRho := 1.0
			if device == config.DeviceFile {
				wantRho = 0.99
			}
			if a.Overlap != 1 || rho < wantRho {
				t.Errorf("identical runs: overlap %v, rank correlation %v; want 1 and at least %v", a.Overlap, rho, wantRho)
			}
			m, stored := e.attachedManifest(t, id)
			got := stored.ManifestRecording
			if got == nil || got.Runs != 2 || got.Overlap == nil || *got.Overlap != a.Overlap ||
				got.RankCorrelation == nil || *got.RankCorrelation != *a.RankCorrelation {
				t.Errorf("record's recording %+v, the result's %+v", got, res.Recording)
			}
			if m.TotalBytes() != res.Bytes || len(m.Ranges) != res.Ranges {
				t.Errorf("manifest %d ranges, %d bytes; result %d, %d", len(m.Ranges), m.TotalBytes(), res.Ranges, res.Bytes)
			}
			if device == config.DeviceUffd && !slices.Equal(m.Ranges, want.Ranges) {
				t.Errorf("two identical runs gave %d ranges, one run of the trace %d", len(m.Ranges), len(want.Ranges))
			}
		})
	}
}

// TestSecondRunFailureKeepsTheFirstRun: a second run that cannot start
// does not lose the recording: the first run's manifest is attached, the
// record says one run, and the result says why.
func TestSecondRunFailureKeepsTheFirstRun(t *testing.T) {
	e := newEnv(t)
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			var starts atomic.Int32
			e.vm.setStartErr(func() error {
				if starts.Add(1) == 2 {
					return errors.New("injected: the VMM did not start")
				}
				return nil
			})
			defer e.vm.setStartErr(nil)
			id, lease := e.publish(t)
			one, err := e.recorder(device).Record(context.Background(), lease)
			if err != nil {
				t.Fatal(err)
			}
			starts.Store(0)
			rec := e.recorder(device)
			rec.Recordings = 2
			res, err := jobResult(t, rec.Start(context.Background(), lease))
			if err != nil {
				t.Fatalf("a failed second run failed the recording: %v", err)
			}
			if res.Recording.Runs != 1 || res.Agreement != nil || !strings.Contains(res.Fallback, "injected") {
				t.Errorf("result %+v: want one run, no comparison, and the second run's error as the fallback", res)
			}
			_, stored := e.attachedManifest(t, id)
			if stored.ManifestRecording == nil || stored.ManifestRecording.Runs != 1 || stored.ManifestRecording.Overlap != nil {
				t.Errorf("record's recording %+v, want one run and no overlap", stored.ManifestRecording)
			}
			if device == config.DeviceUffd && res.Descriptor != one.Descriptor {
				t.Errorf("manifest %+v, the first run alone records %+v", res.Descriptor, one.Descriptor)
			}
		})
	}
}

// TestSecondRunOfADeletedSnapshotIsDiscarded: a deletion between the runs
// is not a flaky rerun: nothing is attached.
func TestSecondRunOfADeletedSnapshotIsDiscarded(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	id, lease := e.publish(t)
	var starts atomic.Int32
	e.vm.setBeforeStart(func() {
		if starts.Add(1) == 2 {
			if err := e.repo.Delete(ctx, id); err != nil {
				t.Error(err)
			}
		}
	})
	defer e.vm.setBeforeStart(nil)
	rec := e.recorder(config.DeviceUffd)
	rec.Recordings = 2
	if _, err := jobResult(t, rec.Start(ctx, lease)); !errors.Is(err, recorder.ErrDiscarded) {
		t.Fatalf("recording of a snapshot deleted before its second run: %v, want ErrDiscarded", err)
	}
	e.checkGone(t, id)
}

// distinctPages is the trace's pages in first-touch order, one read each.
func distinctPages(entries []trace.Entry) []trace.Entry {
	seen := map[int64]bool{}
	var out []trace.Entry
	for _, e := range entries {
		if !seen[e.Offset] {
			seen[e.Offset] = true
			out = append(out, trace.Entry{Offset: e.Offset})
		}
	}
	return out
}

// TestRunsThatDisagree plays another trace on the second run (uffd: each
// fault is one page, so the traces are exactly what the runs touch):
// the reverse order of the same pages gives overlap 1 and rank correlation
// -1, and every mean rank ties, so the manifest keeps the first run's
// order; pages the first run never touched give no common page, and the
// first run's manifest is attached with the reason.
func TestRunsThatDisagree(t *testing.T) {
	e := newEnv(t)
	pages := distinctPages(e.ref.entries)
	reversed := slices.Clone(pages)
	slices.Reverse(reversed)
	touched := map[int64]bool{}
	for _, p := range pages {
		touched[p.Offset] = true
	}
	var elsewhere []trace.Entry
	for off := int64(0); off < memoryBytes && len(elsewhere) < 64; off += trace.PageBytes {
		if !touched[off] {
			elsewhere = append(elsewhere, trace.Entry{Offset: off})
		}
	}
	dir := t.TempDir()
	paths := map[string]string{"reversed": filepath.Join(dir, "reversed.trace"), "elsewhere": filepath.Join(dir, "elsewhere.trace")}
	for name, entries := range map[string][]trace.Entry{"reversed": reversed, "elsewhere": elsewhere} {
		if err := trace.WriteFile(paths[name], entries); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	id, lease := e.publish(t)
	defer lease.End()
	one, err := e.recorder(config.DeviceUffd).Record(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	rec := e.recorder(config.DeviceUffd)
	rec.Recordings = 2

	e.vm.setTraces(e.ref.paths.Trace, paths["reversed"])
	res, err := rec.Record(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	a := res.Agreement
	if a == nil || a.Overlap != 1 || a.RankCorrelation == nil || *a.RankCorrelation != -1 || res.Recording.Runs != 2 {
		t.Fatalf("reversed second run: result %+v, agreement %+v; want overlap 1, rank correlation -1, two runs", res, a)
	}
	if res.Descriptor != one.Descriptor {
		t.Errorf("with every mean rank tied the manifest is %+v, want the first run's order %+v", res.Descriptor, one.Descriptor)
	}

	e.vm.setTraces(e.ref.paths.Trace, paths["elsewhere"])
	defer e.vm.setTraces()
	res, err = rec.Record(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	if res.Recording.Runs != 1 || res.Agreement == nil || res.Agreement.Common != 0 || !strings.Contains(res.Fallback, "no page in common") {
		t.Fatalf("disjoint second run: result %+v; want one run kept and the reason", res)
	}
	if res.Descriptor != one.Descriptor {
		t.Errorf("disjoint runs attached %+v, want the first run's manifest %+v", res.Descriptor, one.Descriptor)
	}
	_, stored := e.attachedManifest(t, id)
	if r := stored.ManifestRecording; r == nil || r.Runs != 1 || r.Overlap == nil || *r.Overlap != 0 || r.RankCorrelation != nil {
		t.Errorf("record's recording %+v, want one run, overlap 0, no correlation", r)
	}
}
