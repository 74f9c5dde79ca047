package metrics

import (
	"context"
	"math"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"warmstart/internal/prefetch"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
)

// series returns the metric of family name whose labels include want.
func series(t *testing.T, s *Set, name string, want map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == k && l.GetValue() == v)
				}
				if !found {
					continue next
				}
			}
			return m
		}
	}
	t.Fatalf("no series %s%v", name, want)
	return nil
}

func TestDeviceBytesSplitStaysMonotonic(t *testing.T) {
	engine := prefetch.NewEngine(prefetch.Options{})
	var device atomic.Uint64
	s := New(engine, func() int { return 0 }, device.Load)
	bytes := func(source string) float64 {
		return series(t, s, metricDeviceBytes, map[string]string{"source": source}).GetCounter().GetValue()
	}

	device.Store(10 << 20)
	if f, p := bytes("fault"), bytes("prefetch"); f != 10<<20 || p != 0 {
		t.Fatalf("before prefetch: fault %v prefetch %v, want 10 MiB and 0", f, p)
	}
	// 4 MiB of prefetch that the devices did not read (already cached):
	// the derived fault bytes would fall to 6 MiB, but a counter must not.
	sub := engine.Join(prefetch.Key{Generation: 1, Digest: "d"},
		prefetch.TargetFunc(func(context.Context, int64, []byte) error { return nil }),
		[]prefetch.Range{{Offset: 0, Length: 4 << 20}}, prefetch.TaskOptions{})
	<-sub.Done()
	if f, p := bytes("fault"), bytes("prefetch"); f != 10<<20 || p != 4<<20 {
		t.Fatalf("after cached prefetch: fault %v prefetch %v, want 10 MiB and 4 MiB", f, p)
	}
	device.Store(16 << 20)
	if f := bytes("fault"); f != 12<<20 {
		t.Fatalf("after more device reads: fault %v, want 12 MiB", f)
	}
}

func TestPhasesAreDifferences(t *testing.T) {
	s := New(prefetch.NewEngine(prefetch.Options{}), func() int { return 0 }, func() uint64 { return 0 })
	ms := time.Millisecond
	s.Phases(restore.Timings{DeviceAcquired: 1 * ms, ManifestValidated: 3 * ms, VMStarted: 6 * ms, Ready: 10 * ms})
	// A guest whose ready time (the VMM's clock) precedes the start call's
	// return adds nothing to the ready phase rather than a negative time.
	s.Phases(restore.Timings{DeviceAcquired: 1 * ms, ManifestValidated: 2 * ms, VMStarted: 5 * ms, Ready: 4 * ms})
	for phase, want := range map[string]float64{
		phaseDeviceAcquire: 0.002, phaseManifestValidate: 0.003, phaseVMStart: 0.006, phaseReady: 0.004,
	} {
		h := series(t, s, metricPhaseSeconds, map[string]string{"phase": phase}).GetHistogram()
		if h.GetSampleCount() != 2 || math.Abs(h.GetSampleSum()-want) > 1e-9 {
			t.Errorf("phase %s: %d samples summing to %v, want 2 summing to %v", phase, h.GetSampleCount(), h.GetSampleSum(), want)
		}
	}
}

func TestSkipReasonsAreBounded(t *testing.T) {
	for reason, want := range map[string]string{
		"prefetch off":                     "mode_off",
		"prefetch.on_restore is off":       "consume_disabled",
		"snapshot has no startup manifest": "no_manifest",
		"io_engine 2 (direct I/O): prefetch not validated for this engine":        "direct_io",
		"manifest rejected (digest): sha256 abc of /x/startup-manifest.bin":       "manifest_rejected",
		"open device file for prefetch: open /run/mem/x.1.mem: permission denied": "other",
	} {
		if got := skipReason(reason); got != want {
			t.Errorf("skipReason(%q) = %q, want %q", reason, got, want)
		}
	}
}

func TestRepositoryLatencyByOutcome(t *testing.T) {
	repo, err := posixfs.Open(filepath.Join(t.TempDir(), "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := New(prefetch.NewEngine(prefetch.Options{}), func() int { return 0 }, func() uint64 { return 0 })
	timed := s.Repository(repo)
	ctx := context.Background()
	if _, err := timed.List(ctx, repository.Filter{}); err != nil {
		t.Fatal(err)
	}
	if _, err := timed.Lookup(ctx, "nobody"); err == nil {
		t.Fatal("lookup of an unknown alias succeeded")
	}
	if _, err := timed.Lookup(ctx, "not/an/alias"); err == nil {
		t.Fatal("lookup of a bad alias succeeded")
	}
	for _, c := range []struct{ op, outcome string }{{"list", "ok"}, {"lookup", "not_found"}, {"lookup", "error"}} {
		h := series(t, s, metricRepositorySeconds, map[string]string{"operation": c.op, "outcome": c.outcome}).GetHistogram()
		if h.GetSampleCount() != 1 {
			t.Errorf("%s %s observed %d times, want 1", c.op, c.outcome, h.GetSampleCount())
		}
	}
}

func TestIntegrityFailuresCountedByArtifactFromStart(t *testing.T) {
	s := New(prefetch.NewEngine(prefetch.Options{}), func() int { return 0 }, func() uint64 { return 0 })
	count := func(artifact string) float64 {
		return series(t, s, metricIntegrity, map[string]string{"artifact": artifact}).GetCounter().GetValue()
	}
	for _, a := range []string{restore.ArtifactMemory, restore.ArtifactVMState, restore.ArtifactDigests} {
		if c := count(a); c != 0 {
			t.Fatalf("%s: %v failures before any restore, want a series at 0", a, c)
		}
	}
	s.IntegrityFailure(restore.ArtifactMemory)
	s.IntegrityFailure(restore.ArtifactMemory)
	s.IntegrityFailure(restore.ArtifactVMState)
	if m, v, d := count(restore.ArtifactMemory), count(restore.ArtifactVMState), count(restore.ArtifactDigests); m != 2 || v != 1 || d != 0 {
		t.Fatalf("counted memory %v vm_state %v digests %v, want 2 1 0", m, v, d)
	}
}

func TestVMExitsByHow(t *testing.T) {
	s := New(prefetch.NewEngine(prefetch.Options{}), func() int { return 0 }, func() uint64 { return 0 })
	count := func(how string) float64 {
		return series(t, s, metricVMExits, map[string]string{"how": how}).GetCounter().GetValue()
	}
	for _, how := range []string{exitSignal, exitError, exitClean} {
		if got := count(how); got != 0 {
			t.Errorf("before any exit: how=%s is %v, want a series at 0", how, got)
		}
	}
	s.VMExited(vmm.ProcessExit{Code: -1, Signal: 9, SignalName: "killed"})
	s.VMExited(vmm.ProcessExit{Code: -1, Signal: 11, SignalName: "segmentation fault"})
	s.VMExited(vmm.ProcessExit{Code: 3})
	s.VMExited(vmm.ProcessExit{Code: 0})
	for how, want := range map[string]float64{exitSignal: 2, exitError: 1, exitClean: 1} {
		if got := count(how); got != want {
			t.Errorf("how=%s is %v, want %v", how, got, want)
		}
	}
}

// The timed repository gives the one it wraps to whoever needs what only
// that backend offers (snapshot verify reads an S3 startup pack through
// it).
func TestTimedRepositoryUnwraps(t *testing.T) {
	repo, err := posixfs.Open(filepath.Join(t.TempDir(), "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := New(prefetch.NewEngine(prefetch.Options{}), func() int { return 0 }, func() uint64 { return 0 })
	u, ok := s.Repository(repo).(interface{ Unwrap() repository.Repository })
	if !ok || u.Unwrap() != repository.Repository(repo) {
		t.Fatalf("the timed repository does not unwrap to the one it times")
	}
}

// The timed repository of a POSIX store still names the store's root, so a
// node stages captures inside it (and publishing hard-links them); one of
// a backend without a root does not seem to have one.
func TestTimedRepositoryKeepsTheRoot(t *testing.T) {
	repo, err := posixfs.Open(filepath.Join(t.TempDir(), "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := New(prefetch.NewEngine(prefetch.Options{}), func() int { return 0 }, func() uint64 { return 0 })
	r, ok := s.Repository(repo).(interface{ Root() string })
	if !ok || r.Root() != repo.Root() {
		t.Fatalf("the timed repository of a POSIX store hides its root (%t)", ok)
	}
	// Embedding only the interface hides Root, like a backend without one.
	rootless := struct{ repository.Repository }{repo}
	if _, ok := s.Repository(rootless).(interface{ Root() string }); ok {
		t.Fatalf("the timed repository of a backend without a root has one")
	}
}
