package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"warmstart/internal/vmm/qemu/qemutest"

	"warmstart/internal/vmm/qemu"
)

// TestRunPauseMeasuresEveryGoal runs bench --pause short on a real guest:
// every child's restore reported the state written before its pause, the
// last child's chain verified, and each kind of resume (file-cold, hot,
// file-warm, flattened, recorded manifest) ran to ready every trial, with
// both manifests' sizes and overlap.
func TestRunPauseMeasuresEveryGoal(t *testing.T) {
	qemutest.RequireGuest(t)
	d, err := qemu.New(qemu.Options{MemoryMiB: 128})
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir(): the guest's Unix sockets live below the work
	// directory, and this test's long name (with the temporary root and
	// the restore's pid) can pass the 107 bytes a socket path may have.
	dir, err := os.MkdirTemp("", "wspb-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// A guest that never answers fails the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rep, err := RunPause(ctx, d, PauseOptions{Cycles: 2, WriteMiB: 4, ResumeTrials: 2,
		WorkDir: filepath.Join(dir, "work"), InitramfsCache: filepath.Join(dir, "initramfs"), Progress: t.Output()})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.WriteTable(&b)
	t.Log("\n" + b.String())
	if rep.CyclesCorrect != 2 || !rep.ChainVerified || len(rep.Samples) != 2 {
		t.Fatalf("%d/%d cycles correct, chain verified %v; want 2/2 and verified", rep.CyclesCorrect, len(rep.Samples), rep.ChainVerified)
	}
	for _, s := range rep.Samples {
		if s.DifferingBytes() <= 0 || s.StoredBytes <= 0 || s.DifferingBytes() > s.WrittenBytes+16<<20 {
			t.Errorf("cycle %d: %d bytes stored, %d differing, %d written", s.Cycle, s.StoredBytes, s.DifferingBytes(), s.WrittenBytes)
		}
	}
	r := rep.Resume
	if r == nil || r.Depth != 2 || r.FlatDepth != 1 || len(r.Trials) != 2 {
		t.Fatalf("resume %+v: want depth 2, flattened to 1, 2 trials", r)
	}
	for i, tr := range r.Trials {
		if tr.Cold <= 0 || tr.Hot <= 0 || tr.Warm <= 0 || tr.Flat <= 0 || tr.Recorded <= 0 {
			t.Errorf("trial %d: %+v, want every restore timed", i, tr)
		}
	}
	if r.Harvested.Pages <= 0 || r.Recorded.Pages <= 0 || r.CommonPages <= 0 || r.Jaccard <= 0 || r.Jaccard > 1 {
		t.Errorf("manifests: harvested %+v, recorded %+v, %d common, Jaccard %v", r.Harvested, r.Recorded, r.CommonPages, r.Jaccard)
	}
}
