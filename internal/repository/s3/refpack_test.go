package s3

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/chunkcache"
	"warmstart/internal/chunkmap"
	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// These tests check what a cold node fetches before ready when the
// snapshot's prefetch follows a refined (learned) manifest rather than the
// recorded one: the refined set is what streams, in few large GETs, and
// every byte served is the published memory.

// refpackMemoryBytes spans 32 chunks of 1 MiB, random (incompressible), so
// a chunk fetched for one page costs a whole MiB.
const refpackMemoryBytes = 32 << 20

// learnedSnapshot is a published snapshot with a recorded manifest (its
// pack built) and the pages of a refinement grown from it.
type learnedSnapshot struct {
	id           string
	memory       []byte
	recorded     *manifest.Manifest
	recordedData []byte
	refined      *manifest.Manifest
	lease        repository.Lease
	publisher    *Repo
	// previous is the refinement file attached last ("" none); restores
	// the restores the last refinement learned from.
	previous string
	restores uint64
}

// publishLearned publishes random memory on publisher, attaches a recorded
// manifest of recordedPages pages scattered over the memory and returns the
// refined manifest that drops dropped of them and adds added pages spread
// over every chunk (not yet attached).
func publishLearned(t *testing.T, publisher *Repo, recordedPages, dropped, added int) *learnedSnapshot {
	t.Helper()
	in := repotest.NewInputs(t, refpackMemoryBytes)
	rec, lease := repotest.PublishInputs(t, publisher, in, "")
	mem, err := os.ReadFile(in.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	perm := rng.Perm(refpackMemoryBytes / 4096)
	recorded := pagesOf(perm[:recordedPages])
	addedPages := pagesOf(perm[recordedPages : recordedPages+added])
	ls := &learnedSnapshot{id: rec.ID, memory: mem, lease: lease, publisher: publisher}
	ls.recorded, ls.recordedData = buildManifest(t, in, recorded)
	if _, err := publisher.AttachManifest(bg(), lease, ls.recordedData, nil); err != nil {
		t.Fatal(err)
	}
	// The refinement: the recorded order with every fifth page among the
	// first 5*dropped gone, the added pages interleaved (learned misses
	// enter at the rank where the guest touched them).
	var refined []int64
	drop := 0
	for i, p := range recorded {
		if drop < dropped && i%5 == 0 {
			drop++
			continue
		}
		refined = append(refined, p)
		if j := i / 3; i%3 == 0 && j < len(addedPages) {
			refined = append(refined, addedPages[j])
		}
	}
	for j := (len(recorded) + 2) / 3; j < len(addedPages); j++ {
		refined = append(refined, addedPages[j])
	}
	ls.refined, _ = buildManifest(t, in, refined)
	return ls
}

func pagesOf(idx []int) []int64 {
	out := make([]int64, len(idx))
	for i, p := range idx {
		out[i] = int64(p) * 4096
	}
	return out
}

func buildManifest(t *testing.T, in repotest.Inputs, pages []int64) (*manifest.Manifest, []byte) {
	t.Helper()
	m, err := manifest.Build(in.Layout, pages)
	if err != nil {
		t.Fatal(err)
	}
	data, err := manifest.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return m, data
}

// attachRefined attaches ls.refined as the snapshot's refinement.
func (ls *learnedSnapshot) attachRefined(t *testing.T) repository.RefinementDescriptor {
	t.Helper()
	data, err := manifest.Encode(ls.refined)
	if err != nil {
		t.Fatal(err)
	}
	d, err := ls.publisher.AttachRefinement(bg(), ls.lease, repository.Refinement{
		BaseSHA256: sha256Hex(ls.recordedData), PreviousSHA256: ls.previous, Restores: ls.restores + 1, Pages: ls.refined.TotalBytes() / 4096,
		Manifest: data, State: []byte("state")})
	if err != nil {
		t.Fatal(err)
	}
	ls.previous, ls.restores = d.SHA256, d.Restores
	return d
}

// storedBytesOf is what the pages of m take stored as startup pack frames
// (their stored, compressed size): the floor of a cold node's fetch.
func storedBytesOf(m *manifest.Manifest, mem []byte) int64 {
	var logical []byte
	for _, r := range m.Ranges {
		logical = append(logical, mem[r.Offset:r.End()]...)
	}
	obj, _ := chunkmap.BuildPack(chunkmap.Digest{}, logical, chunkmap.DefaultFrameBytes)
	return int64(len(obj))
}

// coldPrefetch resolves id on node (whose cache is empty) and drives what a
// restore with prefetch drives: the startup stream (or the cache warming of
// ranges without one), then the device prefetch's reads of ranges through
// the memory reader, all of them done. It checks every byte read against
// mem and returns the requests it took.
func coldPrefetch(t *testing.T, node *Repo, id string, ranges []manifest.Range, mem []byte) RequestStats {
	t.Helper()
	res, err := node.Resolve(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	src := res.Memory.(*memorySource)
	before := node.RequestStats()
	warm, err := src.StreamStartup()
	if err != nil {
		t.Fatal(err)
	}
	if warm == nil {
		if warm, err = src.WarmCache(ranges); err != nil {
			t.Fatal(err)
		}
	}
	rd, err := src.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	for _, rg := range prefetchRanges(src, ranges) {
		buf := make([]byte, rg.Length)
		if _, err := rd.ReadAt(buf, rg.Offset); err != nil {
			t.Fatalf("prefetch read [%d, +%d): %v", rg.Offset, rg.Length, err)
		}
		if !bytes.Equal(buf, mem[rg.Offset:rg.End()]) {
			t.Fatalf("prefetch read [%d, +%d): other bytes than the published memory", rg.Offset, rg.Length)
		}
	}
	if w, ok := warm.(*chunkcache.Warming); ok {
		<-w.Done()
	}
	warm.Stop()
	return node.RequestStats().Sub(before)
}

// coldNode opens another node on the publisher's bucket and prefix, with
// its own empty cache.
func coldNode(t *testing.T, publisher *Repo) *Repo {
	t.Helper()
	o := publisher.opts
	o.CacheDir = t.TempDir()
	return openWith(t, o)
}

// TestColdNodeStreamsTheRefinedSet: a refinement that adds a few hundred
// pages spread over every chunk (and drops some) is what a cold node then
// prefetches; it must fetch about the refined set's stored bytes before
// ready, not the chunks of every learned page (the whole memory).
func TestColdNodeStreamsTheRefinedSet(t *testing.T) {
	publisher := openRepo(t)
	ls := publishLearned(t, publisher, 1024, 100, 300)
	ls.attachRefined(t)
	want := storedBytesOf(ls.refined, ls.memory)

	got := coldPrefetch(t, coldNode(t, publisher), ls.id, ls.refined.Ranges, ls.memory)
	ratio := float64(got.GetBytes) / float64(want)
	t.Logf("cold node, refined manifest: %d GETs, %.2f MiB before ready; refined set stored %.2f MiB (%.2fx)",
		got.Gets, float64(got.GetBytes)/(1<<20), float64(want)/(1<<20), ratio)
	if ratio > 1.15 {
		t.Fatalf("a cold node fetched %.2fx the refined startup set's stored bytes before ready (%d GETs), want <= 1.15x",
			ratio, got.Gets)
	}
}

// prefetchRanges is what the device prefetch of ranges reads through src:
// what the source keeps of them (restore's prefetchable).
func prefetchRanges(src *memorySource, ranges []manifest.Range) []manifest.Range {
	return src.PrefetchRanges(ranges)
}

// demandRead reads every range of ranges through a fresh reader of id's
// memory on node, as a guest's faults would after ready, and checks the
// bytes against mem.
func demandRead(t *testing.T, node *Repo, id string, ranges []manifest.Range, mem []byte) {
	t.Helper()
	rd := openMemory(t, node, id)
	for _, rg := range ranges {
		buf := make([]byte, rg.Length)
		if _, err := rd.ReadAt(buf, rg.Offset); err != nil {
			t.Fatalf("demand read [%d, +%d): %v", rg.Offset, rg.Length, err)
		}
		if !bytes.Equal(buf, mem[rg.Offset:rg.End()]) {
			t.Fatalf("demand read [%d, +%d): other bytes than the published memory", rg.Offset, rg.Length)
		}
	}
}

// TestUnpackedRefinementNeverFetchesTheMemory: a refinement whose pack
// failed to build leaves the recorded pack streaming for the refined
// manifest. A cold node's prefetch then fetches that pack and no chunk
// before ready (the learned pages outside it are left to demand faults),
// and a demand read of every refined page still returns the published
// bytes.
func TestUnpackedRefinementNeverFetchesTheMemory(t *testing.T) {
	publisher := openRepo(t)
	ls := publishLearned(t, publisher, 1024, 100, 300)
	publisher.beforeRefinedPack = func() error { return errors.New("the build failed") }
	ls.attachRefined(t)
	rec, err := publisher.Get(bg(), ls.id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.RefinedPack != nil || rec.StartupPack == nil {
		t.Fatalf("record packs: recorded %v, refined %v; want only the recorded one", rec.StartupPack, rec.RefinedPack)
	}
	node := coldNode(t, publisher)
	got := coldPrefetch(t, node, ls.id, ls.refined.Ranges, ls.memory)
	limit := rec.StartupPack.StoredBytes + rec.StartupPack.StoredBytes*15/100
	t.Logf("cold node, refined manifest, recorded pack only: %d GETs, %.2f MiB before ready; recorded pack %.2f MiB",
		got.Gets, float64(got.GetBytes)/(1<<20), float64(rec.StartupPack.StoredBytes)/(1<<20))
	if int64(got.GetBytes) > limit {
		t.Fatalf("fetched %d bytes before ready, want at most %d (the recorded pack and a small bound)", got.GetBytes, limit)
	}
	demandRead(t, node, ls.id, ls.refined.Ranges, ls.memory)
}

// TestOlderRefinedPackServesANewerRefinement: a refinement close to the
// refined pack already named keeps that pack (nothing more uploaded than
// the refinement); a cold node streams it for the newer manifest, reads
// the few learned pages outside it on demand, every byte the published
// one. A refinement far from it keeps it too until the refinement has
// learned from refinedPackMinRestores more restores, then gets a new pack;
// the superseded one's objects go, and snapshot verify reads the new pack
// whole.
func TestOlderRefinedPackServesANewerRefinement(t *testing.T) {
	publisher := openRepo(t)
	ls := publishLearned(t, publisher, 1024, 100, 300)
	ls.attachRefined(t)
	first, err := publisher.Get(bg(), ls.id)
	if err != nil || first.RefinedPack == nil {
		t.Fatalf("first refinement: refined pack %v (%v)", first.RefinedPack, err)
	}
	t.Logf("rebuilding attach: refined pack of %.2f MiB uploaded", float64(first.RefinedPack.StoredBytes)/(1<<20))

	// A newer refinement: 8 more pages (under 1/64 of the set).
	pages := refinedPages(ls.refined)
	for i := range 8 {
		pages = append(pages, int64(refpackMemoryBytes-(1+2*i)*4096))
	}
	ls.refined = manifestOf(t, pages)
	ls.attachRefined(t)
	second, err := publisher.Get(bg(), ls.id)
	if err != nil || second.RefinedPack == nil || *second.RefinedPack != *first.RefinedPack {
		t.Fatalf("a close refinement replaced the refined pack: %v, want %v (%v)", second.RefinedPack, first.RefinedPack, err)
	}
	node := coldNode(t, publisher)
	got := coldPrefetch(t, node, ls.id, ls.refined.Ranges, ls.memory)
	if limit := first.RefinedPack.StoredBytes * 115 / 100; int64(got.GetBytes) > limit {
		t.Fatalf("fetched %d bytes before ready, want at most %d", got.GetBytes, limit)
	}
	demandRead(t, node, ls.id, ls.refined.Ranges, ls.memory)

	// A node that resolved the first pack reads on while it is superseded.
	stale, err := coldNode(t, publisher).Resolve(bg(), ls.id)
	if err != nil {
		t.Fatal(err)
	}
	staleRd, err := stale.Memory.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer staleRd.Close()
	staleRanges := ls.refined.Ranges

	// A refinement far from the pack: the recorded set again, 300 new
	// pages; the next restore's, then one refinedPackMinRestores later.
	ls.refined = manifestOf(t, append(refinedPages(ls.recorded), pagesOf(rand.New(rand.NewPCG(3, 4)).Perm(refpackMemoryBytes / 4096)[:300])...))
	ls.attachRefined(t)
	if kept, err := publisher.Get(bg(), ls.id); err != nil || kept.RefinedPack == nil || *kept.RefinedPack != *first.RefinedPack {
		t.Fatalf("a far refinement one restore later replaced the refined pack: %v (%v)", kept.RefinedPack, err)
	}
	ls.restores += refinedPackMinRestores
	ls.attachRefined(t)
	third, err := publisher.Get(bg(), ls.id)
	if err != nil || third.RefinedPack == nil || third.RefinedPack.ManifestSHA256 == first.RefinedPack.ManifestSHA256 {
		t.Fatalf("a far refinement kept the refined pack: %v (%v)", third.RefinedPack, err)
	}
	oldObj, oldIdx := refinedPackKeys(publisher.keys, ls.id, first.RefinedPack.ManifestSHA256)
	for _, key := range []string{oldObj, oldIdx} {
		if ok, err := publisher.exists(bg(), key); err != nil || ok {
			t.Fatalf("the superseded refined pack's %s is still there (%v)", key, err)
		}
	}
	// The node that resolved the old pack reads the published bytes
	// without it (from the chunks); a new node streams the new one.
	for _, rg := range staleRanges {
		buf := make([]byte, rg.Length)
		if _, err := staleRd.ReadAt(buf, rg.Offset); err != nil || !bytes.Equal(buf, ls.memory[rg.Offset:rg.End()]) {
			t.Fatalf("read [%d, +%d) after its pack went: %v or other bytes", rg.Offset, rg.Length, err)
		}
	}
	demandRead(t, coldNode(t, publisher), ls.id, ls.refined.Ranges, ls.memory)
	mpath := filepath.Join(t.TempDir(), "manifest")
	if err := os.WriteFile(mpath, ls.recordedData, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := publisher.VerifyStartupPack(bg(), third, mpath); err != nil {
		t.Fatalf("verify the packs: %v", err)
	}
	// A flipped byte in the refined pack is what verify reports.
	newObj, _ := refinedPackKeys(publisher.keys, ls.id, third.RefinedPack.ManifestSHA256)
	rewriteObject(t, publisher, newObj, func(data []byte) []byte {
		data[len(data)/2] ^= 0x5a
		return data
	})
	if err := publisher.VerifyStartupPack(bg(), third, mpath); err == nil || !strings.Contains(err.Error(), "refined startup pack") {
		t.Fatalf("verify of a damaged refined pack: %v, want an error naming it", err)
	}
	// A restore reading past it gets the published bytes from the chunks.
	demandRead(t, coldNode(t, publisher), ls.id, ls.refined.Ranges, ls.memory)
	if err := publisher.Delete(bg(), ls.id); err != nil {
		t.Fatal(err)
	}
	if left, err := publisher.list(bg(), publisher.keys.artifactsPrefix(ls.id)); err != nil || len(left) != 0 {
		t.Fatalf("after delete, %d artifacts left (%v)", len(left), err)
	}
}

// refinedPages lists m's pages in its order.
func refinedPages(m *manifest.Manifest) []int64 {
	var out []int64
	for _, rg := range m.Ranges {
		for off := rg.Offset; off < rg.End(); off += 4096 {
			out = append(out, off)
		}
	}
	return out
}

func manifestOf(t *testing.T, pages []int64) *manifest.Manifest {
	t.Helper()
	m, _ := buildManifest(t, repotest.Inputs{Layout: layout.Single(refpackMemoryBytes)}, pages)
	return m
}

// TestNewRecordingDropsTheRefinedPack: a new recorded manifest clears the
// refinement grown from the old one, and with it the refined pack: the
// record names neither, and both superseded packs' objects are gone.
func TestNewRecordingDropsTheRefinedPack(t *testing.T) {
	publisher := openRepo(t)
	ls := publishLearned(t, publisher, 256, 10, 100)
	ls.attachRefined(t)
	before, err := publisher.Get(bg(), ls.id)
	if err != nil || before.RefinedPack == nil || before.StartupPack == nil {
		t.Fatalf("packs before: %v, %v (%v)", before.StartupPack, before.RefinedPack, err)
	}
	_, other := buildManifest(t, repotest.Inputs{Layout: layout.Single(refpackMemoryBytes)}, refinedPages(ls.refined))
	if _, err := publisher.AttachManifest(bg(), ls.lease, other, nil); err != nil {
		t.Fatal(err)
	}
	after, err := publisher.Get(bg(), ls.id)
	if err != nil || after.Refinement != nil || after.RefinedPack != nil || after.StartupPack == nil ||
		after.StartupPack.ManifestSHA256 == before.StartupPack.ManifestSHA256 {
		t.Fatalf("record after a new recording: refinement %v, refined pack %v, pack %v (%v)",
			after.Refinement, after.RefinedPack, after.StartupPack, err)
	}
	recObj, recIdx := packKeys(publisher.keys, ls.id, before.StartupPack.ManifestSHA256)
	refObj, refIdx := refinedPackKeys(publisher.keys, ls.id, before.RefinedPack.ManifestSHA256)
	for _, key := range []string{recObj, recIdx, refObj, refIdx} {
		if ok, err := publisher.exists(bg(), key); err != nil || ok {
			t.Fatalf("superseded pack object %s is still there (%v)", key, err)
		}
	}
}
