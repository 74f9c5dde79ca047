package daemon_test

import (
	"context"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/manifest"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/trace"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/replay"
)

// switchedVMM is the replay VMM playing whichever trace it was last
// switched to: the recording plays the reference, later restores a
// drifted start-up.
type switchedVMM struct {
	replay.VMM
	path atomic.Pointer[string]
}

func (v *switchedVMM) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	played := replay.VMM{TracePath: *v.path.Load()}
	return played.Restore(ctx, spec)
}

// driftedTrace writes the reference trace with extra pages the recording
// never touched, spread over its first half, and returns its path and the
// extra pages.
func driftedTrace(t *testing.T, f *fixture, m *manifest.Manifest, extra int) (string, []int64) {
	t.Helper()
	entries, err := trace.ReadFile(f.ref.Trace)
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[int64]bool{}
	for _, r := range m.Ranges {
		for off := r.Offset; off < r.End(); off += trace.PageBytes {
			recorded[off] = true
		}
	}
	p, err := restore.LookupPolicy(restore.DefaultPolicy)
	if err != nil {
		t.Fatal(err)
	}
	gap := p.GapBytes
	var pages []int64
	var drifted []trace.Entry
	every := len(entries) / 2 / extra
	for i, e := range entries {
		drifted = append(drifted, e)
		if len(pages) == extra || i%every != 0 {
			continue
		}
		// The next page after this one that lies farther than the
		// prefetch's gap from every recorded page: a page in a smaller gap
		// would be prefetched along and not missed.
		off := e.Offset + trace.PageBytes
		for tries := 0; nearRecorded(recorded, off, gap) || off >= memoryBytes; tries++ {
			if tries > memoryBytes/trace.PageBytes {
				t.Fatalf("no page of the memory lies farther than %d bytes from every recorded page", gap)
			}
			off = (off + trace.PageBytes) % memoryBytes
		}
		recorded[off] = true
		pages = append(pages, off/trace.PageBytes)
		drifted = append(drifted, trace.Entry{Offset: off})
	}
	path := filepath.Join(t.TempDir(), "drifted.trace")
	if err := trace.WriteFile(path, drifted); err != nil {
		t.Fatal(err)
	}
	return path, pages
}

// nearRecorded reports whether a recorded page lies within gap bytes of
// the page at off (that page included).
func nearRecorded(recorded map[int64]bool, off, gap int64) bool {
	for o := max(0, off-gap-trace.PageBytes); o <= off+gap+trace.PageBytes; o += trace.PageBytes {
		if recorded[o] {
			return true
		}
	}
	return false
}

// TestRestoresRefineTheManifest: a restore whose guest starts up
// differently from the recording misses pages; the daemon learns from it
// in the background, and the next restore prefetches a refined manifest
// that holds them, so it misses none.
func TestRestoresRefineTheManifest(t *testing.T) {
	f := newFixture(t, fixtureOptions{recordOnPublish: true})
	vm := &switchedVMM{VMM: replay.VMM{TracePath: f.ref.Trace}}
	vm.path.Store(&f.ref.Trace)
	r := startDaemon(t, f, func(o *daemon.Options) { o.VMM = vm })
	ctx := context.Background()
	attached := r.log.logged("startup manifest attached")
	imp := r.importAs(t, f, "drifting")
	<-attached
	_, data, m, err := repository.ReadManifest(ctx, f.options(t).Repository, imp.ID)
	if err != nil {
		t.Fatal(err)
	}
	recorded := manifest.Digest(data)
	path, extra := driftedTrace(t, f, m, 12)
	vm.path.Store(&path)

	refined := r.log.logged("startup manifest refined")
	first := restoreAndStop(t, r, imp.ID)
	if first.Prefetch.Manifest != restore.ManifestRecorded || first.StartupSet.MissedPages != int64(len(extra)) {
		t.Fatalf("drifted restore: manifest %q, %d pages missed; want the recorded one and %d missed",
			first.Prefetch.Manifest, first.StartupSet.MissedPages, len(extra))
	}
	info := waitRefined(t, r, refined, imp.ID, len(extra), recorded)

	second := restoreAndStop(t, r, imp.ID)
	if p := second.Prefetch; p.Manifest != restore.ManifestRefined || p.Digest != info.Refinement.ManifestSHA256 {
		t.Fatalf("next restore prefetched %+v, want the refined manifest %s", p, info.Refinement.ManifestSHA256)
	}
	if second.StartupSet.MissedPages != 0 || second.Ready.SHA256 == "" {
		t.Fatalf("next restore still missed %d pages", second.StartupSet.MissedPages)
	}
}

// waitRefined waits for the daemon's refinement line after the restore
// that missed added pages of the manifest with digest recorded, checks it,
// and returns the snapshot as it then is.
func waitRefined(t *testing.T, r *running, refined <-chan struct{}, id string, added int, recorded string) api.SnapshotInfo {
	t.Helper()
	select {
	case <-refined:
	case <-time.After(time.Minute):
		t.Fatal("no refinement logged after a prefetching restore")
	}
	line := r.log.attrsOf("startup manifest refined")
	if line["added"] != strconv.Itoa(added) || line["digest_before"] != recorded {
		t.Fatalf("refinement line %v: want %d pages added to %s", line, added, recorded)
	}
	info, err := r.client.Snapshot(context.Background(), id)
	if err != nil || info.Refinement == nil || info.Refinement.Restores != 1 {
		t.Fatalf("snapshot after learning: %+v, %v", info.Refinement, err)
	}
	return info
}

// restoreAndStop restores id on the uffd device (a fault is one page
// there, so missed pages are exact) with prefetch on, and stops it.
func restoreAndStop(t *testing.T, r *running, id string) api.RestoreInfo {
	t.Helper()
	ctx := context.Background()
	in, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: id, Device: "uffd", Prefetch: "on"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.StopRestore(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	return in
}
