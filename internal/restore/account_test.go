package restore_test

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
)

// tracePages is the set of pages the reference trace touches.
func tracePages(e *env) map[int64]bool {
	pages := map[int64]bool{}
	for _, en := range e.ref.entries {
		pages[en.Offset/startupset.PageBytes] = true
	}
	return pages
}

// withoutEveryFifth is pages less every fifth page number, and how many
// pages that left out.
func withoutEveryFifth(pages map[int64]bool) (kept map[int64]bool, dropped int64) {
	kept = map[int64]bool{}
	for p := range pages {
		if p%5 == 0 {
			dropped++
			continue
		}
		kept[p] = true
	}
	return kept, dropped
}

// withManifest returns src with a manifest of exactly pages attached.
func withManifest(t *testing.T, e *env, src restore.Source, pages map[int64]bool) restore.Source {
	t.Helper()
	var offsets []int64
	for p := range pages {
		offsets = append(offsets, p*startupset.PageBytes)
	}
	data := buildManifest(t, e, offsets)
	path := filepath.Join(t.TempDir(), "startup-manifest.bin")
	must(t, os.WriteFile(path, data, 0o444))
	d := manifest.Describe(data)
	src.ManifestPath, src.Manifest = path, &d
	return src
}

// The startup-set counters on both devices agree with what the replay
// VMM's trace and the manifest imply. The file device is mounted with a
// one-page readahead window, so that a demand request is the faulting page
// and nothing around it.
func TestStartupSetAccounting(t *testing.T) {
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			e := newEnv(t, envOptions{noManifest: true, readAheadBytes: startupset.PageBytes})
			touched := tracePages(e)
			n := int64(len(touched))
			full := withManifest(t, e, e.source(t), touched)
			c := &accountingCase{e: e, device: device, touched: touched, n: n, full: full}

			t.Run("manifest is the trace, prefetch before start", c.traceManifestPrefetchFirst)
			t.Run("manifest is the trace, concurrent", c.traceManifestConcurrent)
			t.Run("manifest lacks pages", c.manifestLacksPages)
			t.Run("small gaps come along", c.smallGapsComeAlong)
			t.Run("prefetch off", c.prefetchOff)
		})
	}
}

// accountingCase is one device's reference snapshot with the pages its
// trace touches and a source whose manifest is exactly those pages.
type accountingCase struct {
	e       *env
	device  string
	touched map[int64]bool
	n       int64
	full    restore.Source
}

// traceManifestPrefetchFirst: with the whole trace planned and prefetch
// first, every touched page is in time.
func (c *accountingCase) traceManifestPrefetchFirst(t *testing.T) {
	e, device, n, full := c.e, c.device, c.n, c.full
	rep := e.accounted(t, full, restore.Options{Device: device, Prefetch: restore.ModeOn, Policy: policy(t, "reap")})
	want := startupset.Report{StartupSetPages: n, InTimePages: n}
	expectCounts(t, rep, want)
	// Every page was in before the guest ran. (A stray request
	// can still reach the file device after the prefetch: it
	// counts as demand but makes no page late.)
	if rep.PrefetchBytes < n*startupset.PageBytes {
		t.Errorf("prefetch %d bytes: want at least %d", rep.PrefetchBytes, n*startupset.PageBytes)
	}
	if rep.PrefetchEndedBeforeReady == nil || *rep.PrefetchEndedBeforeReady <= 0 {
		t.Errorf("prefetch before start ended %v before ready, want > 0", rep.PrefetchEndedBeforeReady)
	}
}

// traceManifestConcurrent: with prefetch alongside the guest, a touched
// page is in time or late, never missed.
func (c *accountingCase) traceManifestConcurrent(t *testing.T) {
	e, device, n, full := c.e, c.device, c.n, c.full
	rep := e.accounted(t, full, restore.Options{Device: device, Prefetch: restore.ModeOn, Policy: exactPolicy(t)})
	if rep.MissedPages != 0 || rep.UnusedPages != 0 || rep.InTimePages+rep.LatePages != n {
		t.Errorf("every touched page is in time or late, none missed or unused: %+v", rep)
	}
	// Each late page took a fault of its own; a fault can also
	// race a prefetch that lands first (then the page is in time).
	if rep.DemandRequests < rep.LatePages || rep.DemandBytes != rep.DemandRequests*startupset.PageBytes {
		t.Errorf("%d demand requests (%d bytes), %d late pages: want a one-page fault per late page",
			rep.DemandRequests, rep.DemandBytes, rep.LatePages)
	}
}

// manifestLacksPages: pages left out of the manifest count as missed
// unless a read-ahead brought them in.
func (c *accountingCase) manifestLacksPages(t *testing.T) {
	e, device, n, touched := c.e, c.device, c.n, c.touched
	partial, dropped := withoutEveryFifth(touched)
	src := withManifest(t, e, e.source(t), partial)
	inst := e.restoreAccounted(t, src, restore.Options{Device: device, Prefetch: restore.ModeOn, Policy: policy(t, "reap")})
	// A buffered read through the device file reads ahead past
	// its range: a dropped page it brought in is not missed.
	readAhead := int64(0)
	for p := range prefetchedPages(inst) {
		if touched[p] && !partial[p] {
			readAhead++
		}
	}
	if device == config.DeviceUffd && readAhead != 0 {
		t.Errorf("uffd installs exactly the plan, yet %d dropped pages were installed", readAhead)
	}
	expectCounts(t, inst.StartupSet, startupset.Report{StartupSetPages: n - dropped, InTimePages: n - dropped, MissedPages: dropped - readAhead})
}

// smallGapsComeAlong: with a plan that takes small gaps (prefetch first,
// so that no fault races it), every page in a gap of at most GapBytes
// between recorded pages is brought in, a touched one is not missed, and
// the startup set is still the manifest's pages alone.
func (c *accountingCase) smallGapsComeAlong(t *testing.T) {
	e, device, n, touched := c.e, c.device, c.n, c.touched
	partial, dropped := withoutEveryFifth(touched)
	src := withManifest(t, e, e.source(t), partial)
	p := policy(t, "reap")
	p.GapBytes = policy(t, "warmstart").GapBytes
	inst := e.restoreAccounted(t, src, restore.Options{Device: device, Prefetch: restore.ModeOn, Policy: p})
	prefetched := prefetchedPages(inst)
	inGaps, caught := int64(0), int64(0)
	for page := range gapPages(partial, p.GapBytes/startupset.PageBytes) {
		if !prefetched[page] {
			t.Fatalf("page %d lies in a gap of at most %d bytes between recorded pages and was not prefetched", page, p.GapBytes)
		}
		if touched[page] {
			inGaps++
		}
	}
	for page := range touched {
		if !partial[page] && prefetched[page] {
			caught++
		}
	}
	if inGaps == 0 {
		t.Fatal("no touched page lies in a small gap of the manifest: the case tests nothing")
	}
	t.Logf("%d of %d pages left out of the manifest were prefetched along (%d in small gaps)", caught, dropped, inGaps)
	if want := int64(len(gapPages(partial, p.GapBytes/startupset.PageBytes))) * startupset.PageBytes; inst.Prefetch.GapBytes != want {
		t.Errorf("the report says the plan took %d bytes of gaps along, want the %d between recorded pages", inst.Prefetch.GapBytes, want)
	}
	expectCounts(t, inst.StartupSet, startupset.Report{StartupSetPages: n - dropped, InTimePages: n - dropped, MissedPages: dropped - caught})
}

// gapPages are the pages between two recorded pages (neighbours in
// memory) at most maxGap pages apart.
func gapPages(recorded map[int64]bool, maxGap int64) map[int64]bool {
	pages := slices.Sorted(maps.Keys(recorded))
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

// prefetchOff: every touched page is late and fetched on demand.
func (c *accountingCase) prefetchOff(t *testing.T) {
	e, device, n, full := c.e, c.device, c.n, c.full
	rep := e.accounted(t, full, restore.Options{Device: device, Prefetch: restore.ModeOff})
	expectCounts(t, rep, startupset.Report{StartupSetPages: n, LatePages: n})
	if rep.PrefetchRan || rep.PrefetchBytes != 0 || rep.DemandBytes != n*startupset.PageBytes {
		t.Errorf("prefetch off: ran %v, %d prefetch bytes, %d demand bytes (want %d)", rep.PrefetchRan, rep.PrefetchBytes, rep.DemandBytes, n*startupset.PageBytes)
	}
}

// accounted restores src, checks the guest read the published bytes,
// stops it (so the next restore gets a cold device) and returns its
// startup-set report.
func (e *env) accounted(t *testing.T, src restore.Source, opts restore.Options) startupset.Report {
	t.Helper()
	return e.restoreAccounted(t, src, opts).StartupSet
}

// prefetchedPages are the pages prefetch brought in by ready.
func prefetchedPages(inst *restore.Instance) map[int64]bool {
	pages := map[int64]bool{}
	for _, ev := range inst.Events {
		if ev.Kind == memdev.Prefetch && ev.ByReady(inst.Timings.Ready) {
			for off := ev.Offset; off < ev.Offset+int64(ev.Length); off += startupset.PageBytes {
				pages[off/startupset.PageBytes] = true
			}
		}
	}
	return pages
}

func (e *env) restoreAccounted(t *testing.T, src restore.Source, opts restore.Options) *restore.Instance {
	t.Helper()
	inst := e.restore(t, e.restorer, src, opts)
	checkHash(t, inst, e.ref.expected)
	stop(t, inst)
	t.Logf("%s", startupset.Line(inst.StartupSet))
	for _, ev := range inst.Events {
		if ev.Kind == memdev.Resident {
			t.Errorf("a fresh device generation had resident pages: %+v", ev)
			break
		}
	}
	return inst
}

// expectCounts compares the page counts of got with want.
func expectCounts(t *testing.T, got, want startupset.Report) {
	t.Helper()
	type counts struct{ set, inTime, late, unused, missed int64 }
	g := counts{got.StartupSetPages, got.InTimePages, got.LatePages, got.UnusedPages, got.MissedPages}
	w := counts{want.StartupSetPages, want.InTimePages, want.LatePages, want.UnusedPages, want.MissedPages}
	if g != w {
		t.Errorf("pages (set, in time, late, unused, missed) = %+v, want %+v", g, w)
	}
}
