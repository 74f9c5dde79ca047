package recorder_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/manifest"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
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
	offsets := make([]int64, len(e.ref.entries))
	for i, en := range e.ref.entries {
		offsets[i] = en.Offset
	}
	want, err := manifest.Build(e.ref.layout, offsets)
	if err != nil {
		t.Fatal(err)
	}
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
