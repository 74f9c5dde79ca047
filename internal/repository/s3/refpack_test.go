package s3

import (
	"bytes"
	"math/rand/v2"
	"os"
	"testing"

	"warmstart/internal/chunkcache"
	"warmstart/internal/chunkmap"
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
		BaseSHA256: sha256Hex(ls.recordedData), Restores: 1, Pages: ls.refined.TotalBytes() / 4096,
		Manifest: data, State: []byte("state")})
	if err != nil {
		t.Fatal(err)
	}
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
	rd, err := src.OpenMemory()
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

// prefetchRanges is what the device prefetch of ranges reads through src.
func prefetchRanges(_ *memorySource, ranges []manifest.Range) []manifest.Range { return ranges }
