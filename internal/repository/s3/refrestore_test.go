package s3

import (
	"errors"
	"testing"

	"warmstart/internal/manifest"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// TestColdRestoreOfARefinedSnapshot restores, on cold nodes with refine
// on, a reference snapshot whose refinement adds 200 pages spread over the
// whole memory to the recorded set (pages the replay guest does not
// touch): with the refined pack, and with its build failed (the recorded
// pack streams for the refined manifest). Either way the guest reads the
// published bytes, the refined manifest is what prefetched, and the bytes
// fetched up to the end of the restore stay within 1.15x of the pack
// streamed, not the chunks of every learned page.
func TestColdRestoreOfARefinedSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name       string
		buildFails bool
		seed       uint64
	}{{"refined pack", false, 17}, {"refined pack failed to build", true, 18}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, server.Endpoint)
			w.restorer.Refine = true
			w.prefetchAsANode(t)
			publisher := w.repo(t, 0)
			snap := w.publish(t, publisher, tc.seed)
			if tc.buildFails {
				publisher.beforeRefinedPack = func() error { return errRefinedPackTest }
			}
			rec := attachSpreadRefinement(t, publisher, snap.id, 200)
			streamed := rec.RefinedPack
			if tc.buildFails {
				if rec.RefinedPack != nil {
					t.Fatal("the failed build named a refined pack")
				}
				streamed = rec.StartupPack
			}
			if streamed == nil {
				t.Fatal("no pack to stream")
			}
			o := testOptions(t, w.endpoint)
			o.Prefix, o.Fill.Disabled = w.prefix, true // nothing after ready but the restore's own reads
			node := openWith(t, o)
			if _, err := node.Resolve(bg(), snap.id); err != nil { // the small files, cached
				t.Fatal(err)
			}
			before := node.RequestStats()
			inst := w.restoreOK(t, node, snap, restore.ModeOn)
			if err := inst.Stop(bg()); err != nil {
				t.Fatal(err)
			}
			got := node.RequestStats().Sub(before)
			if inst.Prefetch.Manifest != restore.ManifestRefined {
				t.Fatalf("prefetched the %q manifest, want the refined one", inst.Prefetch.Manifest)
			}
			// The learned pages the recorded pack lacks are left to demand.
			if left := inst.Prefetch.LeftToDemandBytes; (left > 0) != tc.buildFails {
				t.Fatalf("%d planned bytes left to demand faults, want some only without the refined pack", left)
			}
			ratio := float64(got.GetBytes) / float64(streamed.StoredBytes)
			t.Logf("%s: ready %v, %d GETs, %.2f MiB, %.2fx the %.2f MiB pack", tc.name, inst.Timings.Ready, got.Gets,
				float64(got.GetBytes)/(1<<20), ratio, float64(streamed.StoredBytes)/(1<<20))
			if ratio > 1.15 {
				t.Fatalf("a cold restore fetched %.2fx its pack's stored bytes (%d GETs), want <= 1.15x", ratio, got.Gets)
			}
		})
	}
}

// errRefinedPackTest is a refined pack build made to fail.
var errRefinedPackTest = errors.New("refined pack build failed (test)")

// attachSpreadRefinement attaches to id a refinement of its recorded
// manifest that adds extra pages spread evenly over the memory, one after
// every few recorded ranges, and returns the record after it.
func attachSpreadRefinement(t *testing.T, r *Repo, id string, extra int) repository.Record {
	t.Helper()
	rec, err := r.Get(bg(), id)
	if err != nil || rec.Manifest == nil {
		t.Fatalf("record %s: manifest %v (%v)", id, rec.Manifest, err)
	}
	data := readObject(t, r, r.keys.artifact(id, repository.ManifestFileName))
	m, err := manifest.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	recorded := refinedPages(m)
	in := make(map[int64]bool, len(recorded))
	for _, p := range recorded {
		in[p] = true
	}
	var added []int64
	stride := rec.MemorySize / int64(extra) / 4096 * 4096
	for off := int64(0); off < rec.MemorySize && len(added) < extra; off += stride {
		for p := off; p < min(off+stride, rec.MemorySize); p += 4096 {
			if !in[p] {
				added = append(added, p)
				break
			}
		}
	}
	var pages []int64
	every := max(1, len(recorded)/len(added))
	for i, p := range recorded {
		pages = append(pages, p)
		if i%every == 0 && i/every < len(added) {
			pages = append(pages, added[i/every])
		}
	}
	refined, err := manifest.Build(m.Layout, pages)
	if err != nil {
		t.Fatal(err)
	}
	rdata, err := manifest.Encode(refined)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := r.LeaseExisting(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	if _, err := r.AttachRefinement(bg(), lease, repository.Refinement{BaseSHA256: rec.Manifest.SHA256, Restores: 1,
		Pages: refined.TotalBytes() / 4096, Manifest: rdata, State: []byte("state")}); err != nil {
		t.Fatal(err)
	}
	if rec, err = r.Get(bg(), id); err != nil {
		t.Fatal(err)
	}
	return rec
}
