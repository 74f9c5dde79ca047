package restore_test

import (
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/refine"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
)

// farPages returns up to n pages of the memory file at least gap pages away
// from every touched page.
func farPages(touched map[int64]bool, filePages int64, gap int64, n int) map[int64]bool {
	far := map[int64]bool{}
	for p := int64(0); p < filePages && len(far) < n; p += gap {
		near := false
		for q := max(0, p-gap); q <= p+gap && !near; q++ {
			near = touched[q]
		}
		if !near {
			far[p] = true
		}
	}
	return far
}

// On the file device a prefetched page the guest uses makes no request to
// the device, but it is mapped in the VMM: at ready, every page the trace
// touched is reported touched, and planned pages far from any touch (more
// than the kernel's 64 KiB fault-around window) are reported untouched,
// though prefetch brought them into the page cache.
func TestTouchedAtReadySeesPrefetchedPagesTheGuestUsed(t *testing.T) {
	e := newEnv(t, envOptions{noManifest: true, device: config.DeviceFile})
	touched := tracePages(e)
	filePages := e.ref.layout.FileSize / startupset.PageBytes
	far := farPages(touched, filePages, 16, 64)
	if len(far) < 8 {
		t.Fatalf("only %d pages far from the trace", len(far))
	}
	t.Logf("%d touched pages, %d planned far from them", len(touched), len(far))
	planned := map[int64]bool{}
	for _, set := range []map[int64]bool{touched, far} {
		for p := range set {
			planned[p] = true
		}
	}
	src := withManifest(t, e, e.source(t), planned)
	inst := e.restore(t, e.restorer, src, restore.Options{Device: config.DeviceFile, Prefetch: restore.ModeOn, Policy: policy(t, "reap")})
	checkHash(t, inst, e.ref.expected)
	pages := restore.TouchedAtReady(inst, e.ref.layout.FileSize)
	stop(t, inst)
	if pages == nil {
		t.Fatal("the replay VMM's residency is unknown on the file device")
	}
	for p := range touched {
		if got, known := pages.Touched(p); !got || !known {
			t.Fatalf("page %d was touched by the trace but is reported touched=%v known=%v", p, got, known)
		}
	}
	for p := range far {
		if got, _ := pages.Touched(p); got {
			t.Errorf("page %d was prefetched but never touched, yet reported touched", p)
		}
	}
	checkObservedUntouched(t, inst.Observation, touched, far)
}

// checkObservedUntouched: the restore's own observation, for learning,
// uses the same probe: the far pages are untouched (so they can age out)
// although prefetch brought them in, and no touched page is.
func checkObservedUntouched(t *testing.T, obs *refine.Observation, touched, far map[int64]bool) {
	t.Helper()
	if obs == nil {
		t.Fatal("a prefetching restore has no observation")
	}
	untouched := map[int64]bool{}
	for _, p := range obs.Untouched {
		untouched[p] = true
	}
	for p := range far {
		if !untouched[p] {
			t.Errorf("page %d: prefetched, never touched, not in the observation's untouched pages", p)
		}
	}
	for p := range touched {
		if untouched[p] {
			t.Fatalf("page %d was touched but is in the observation's untouched pages", p)
		}
	}
}
