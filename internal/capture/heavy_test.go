package capture_test

import (
	"fmt"
	"testing"
	"warmstart/internal/vmm/qemu/qemutest"

	"warmstart/internal/agentspec"
	"warmstart/internal/vmm/qemu"
)

// TestHeavyGuestStartupSet captures a guest whose agent walks a 40 MiB
// heap of mixed-size objects and a third of a drifting 24 MiB pool at each
// resume (the heavier guest the benchmarks measure), records its manifest
// from two traced restores, and checks the startup set follows the
// workload: one restore touches about the heap, the walked pool and the
// light guest's few MiB of kernel and files; the two restores walk
// different parts of the pool, so they overlap less than the light guest's
// near-identical runs, and the manifest keeps the heap both walked.
func TestHeavyGuestStartupSet(t *testing.T) {
	qemutest.RequireGuest(t)
	w := agentspec.Workload{HeapMiB: 40, PoolMiB: 24, PoolFraction: 0.33}
	var g guestFixture
	defer g.close()
	if err := g.build(qemu.Options{MemoryMiB: 256, AgentWorkload: w.String()}); err != nil {
		t.Fatalf("capture a guest with workload %s: %v", w, err)
	}
	const mib = 1 << 20
	touched := float64(g.rec.Touches) * 4096 / mib
	walked := float64(w.HeapMiB) + float64(w.PoolMiB)*w.PoolFraction
	a := g.rec.Agreement
	if a == nil {
		t.Fatalf("the recording compared no two runs: %+v (fallback %q)", g.rec.Recording, g.rec.Fallback)
	}
	rho := "none"
	if a.RankCorrelation != nil {
		rho = fmt.Sprintf("%.3f", *a.RankCorrelation)
	}
	t.Logf("workload %s in a 256 MiB guest under %s: boot to agent %v; one restore touched %.1f MiB (%.1f MiB walked); "+
		"two restores: %.1f and %.1f MiB, overlap %.3f, rank correlation %s; manifest %.1f MiB in %d ranges",
		w, g.snap.Accel, g.snap.Boot, touched, walked, float64(a.PagesFirst)*4096/mib, float64(a.PagesSecond)*4096/mib,
		a.Overlap, rho, float64(g.rec.Bytes)/mib, g.rec.Ranges)
	// The light guest's kernel, files and agent runtime add a few MiB; the
	// allocator's rounding of the objects a little more.
	if lo, hi := walked, walked+16; touched < lo || touched > hi {
		t.Errorf("one restore touched %.1f MiB; want %.0f to %.0f MiB for a walk of %.1f MiB", touched, lo, hi, walked)
	}
	if a.Overlap < 0.5 || a.Overlap > 0.95 {
		t.Errorf("two restores overlap %.3f; want between 0.5 and 0.95 for a pool walked a third at a time", a.Overlap)
	}
	if got := float64(g.rec.Bytes) / mib; got < float64(w.HeapMiB) || got > touched {
		t.Errorf("the manifest covers %.1f MiB; want the %d MiB heap, and no more than one restore touched (%.1f MiB)", got, w.HeapMiB, touched)
	}
}
