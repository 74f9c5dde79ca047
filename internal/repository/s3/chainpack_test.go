package s3

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/chunkmap"
	"warmstart/internal/layers"
	"warmstart/internal/manifest"
	"warmstart/internal/pause"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
	"warmstart/internal/trace"
	"warmstart/internal/vmm/replay"
)

// pausedChild is a child paused on one node: its record and the memory
// its chain must read as (the base's with the guest's writes stamped).
type pausedChild struct {
	rec      repository.Record
	memory   string
	expected string // the replay guest's hash over memory
}

// chainStamp is the replay VMM's write stamp of the paused restores.
const chainStamp = 0xc4a1

// pauseOnNode restores snap pausable on node (prefetch on, as a node
// does), lets its replay guest write its trace's write pages stamped, and
// pauses it into a child (then stop), which carries the harvested
// manifest.
func (w *world) pauseOnNode(t *testing.T, node *Repo, snap snapshot) pausedChild {
	t.Helper()
	res, err := node.Resolve(bg(), snap.id)
	if err != nil {
		t.Fatal(err)
	}
	w.restorer.VMM = &replay.VMM{TracePath: snap.paths.Trace, WriteStamp: chainStamp}
	inst, err := w.restorer.Restore(bg(), restore.SourceIn(bg(), node, res),
		restore.Options{Device: w.device, Prefetch: restore.ModeOn, Pausable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Stop(bg())
	pr, err := pause.Run(bg(), node, inst, pause.Request{Stop: true}, pause.Options{StagingDir: t.TempDir()})
	if err != nil {
		t.Fatalf("pause: %v", err)
	}
	if pr.Child.Manifest == nil || pr.Pages.Stored == 0 {
		t.Fatalf("child %+v (pages %+v): want a harvested manifest and a layer of written pages", pr.Child, pr.Pages)
	}
	entries, err := trace.ReadFile(snap.paths.Trace)
	if err != nil {
		t.Fatal(err)
	}
	mem := stampedCopy(t, snap.paths.Memory, entries)
	want, err := replay.ExpectedHash(mem, entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pausedChild{rec: pr.Child, memory: mem, expected: want}
}

// stampedCopy is a copy of the memory file mem with every page the trace
// writes stamped as the replay VMM stamps it.
func stampedCopy(t *testing.T, mem string, entries []trace.Entry) string {
	t.Helper()
	data, err := os.ReadFile(mem)
	if err != nil {
		t.Fatal(err)
	}
	written := 0
	for _, e := range entries {
		if e.Write {
			binary.LittleEndian.PutUint64(data[e.Offset:], replay.StampOf(chainStamp, e.Offset))
			written++
		}
	}
	if written == 0 {
		t.Fatal("the reference trace writes no page")
	}
	out := filepath.Join(t.TempDir(), "stamped")
	if err := os.WriteFile(out, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// startupSetStoredBytes is what the startup set of rec's manifest costs
// stored: its pages of the memory file mem, in the manifest's order,
// compressed into a pack's frames. It depends on neither where the pages
// live in the chain nor on how the store keeps them.
func startupSetStoredBytes(t *testing.T, r *Repo, rec repository.Record, mem string) (stored, logical int64) {
	t.Helper()
	m, err := manifest.Decode(readObject(t, r, r.keys.artifact(rec.ID, repository.ManifestFileName)))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(mem)
	if err != nil {
		t.Fatal(err)
	}
	var set []byte
	for _, rg := range m.Ranges {
		set = append(set, data[rg.Offset:rg.End()]...)
	}
	obj, _ := chunkmap.BuildPack(chunkmap.Digest{}, set, chunkmap.DefaultFrameBytes)
	return int64(len(obj)), int64(len(set))
}

// checkChainMemory reads every page of id's memory through node and
// compares it with the file want.
func checkChainMemory(t *testing.T, node *Repo, id, want string) {
	t.Helper()
	_, rd := resolveMemory(t, node, id)
	defer rd.Close()
	exp, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(exp))
	if _, err := rd.ReadAt(got, 0); err != nil {
		t.Fatalf("read the memory of %s: %v", id, err)
	}
	for off := 0; off < len(exp); off += layers.PageBytes {
		if !bytes.Equal(got[off:off+layers.PageBytes], exp[off:off+layers.PageBytes]) {
			t.Fatalf("page at %d of %s differs from the expected chain", off, id)
		}
	}
}

// TestPauseOnS3RestoresOnAnotherNode: a base published on S3 is restored
// pausable on node A, its guest writes pages and is paused into a child
// (harvested manifest); node B, its node cache empty, restores the child
// on each memory device: the guest reads the published chain, every page
// of the child's memory is the expected one, and B fetched no more than
// 1.15x the stored bytes of the child's startup set before ready, although
// the set lies mostly in the base's layer.
func TestPauseOnS3RestoresOnAnotherNode(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	w.prefetchAsANode(t)
	nodeA := w.repo(t, 0)
	snap := w.publish(t, nodeA, 31)
	child := w.pauseOnNode(t, nodeA, snap)
	for _, device := range deviceKinds {
		t.Run(device, func(t *testing.T) {
			w.device = device
			defer func() { w.device = "" }()
			coldRestoreOfChild(t, w, snap, child)
		})
	}
}

// coldRestoreOfChild restores child on a node whose cache is empty and
// checks what it read and what it fetched before ready.
func coldRestoreOfChild(t *testing.T, w *world, snap snapshot, child pausedChild) {
	o := testOptions(t, w.endpoint)
	o.Prefix, o.Fill.Disabled = w.prefix, true // nothing after ready but the restore's own reads
	nodeB := openWith(t, o)
	if _, err := nodeB.Resolve(bg(), child.rec.ID); err != nil { // the small files, cached
		t.Fatal(err)
	}
	before := nodeB.RequestStats()
	inst := w.restoreOK(t, nodeB, snapshot{id: child.rec.ID, paths: snap.paths, expected: child.expected}, restore.ModeOn)
	atReady := nodeB.RequestStats().Sub(before)
	if err := inst.Stop(bg()); err != nil {
		t.Fatal(err)
	}
	total := nodeB.RequestStats().Sub(before)
	stored, logical := startupSetStoredBytes(t, nodeB, child.rec, child.memory)
	ratio := float64(total.GetBytes) / float64(stored)
	t.Logf("cold restore of the child: ready %v; before ready %d GETs, %.2f MiB; to its stop %d GETs, %.2f MiB; "+
		"startup set %.2f MiB stored (%.2f MiB of pages): %.2fx; load %s", inst.Timings.Ready,
		atReady.Gets, mib(atReady.GetBytes), total.Gets, mib(total.GetBytes), mib(uint64(stored)), mib(uint64(logical)), ratio, loadavg())
	if ratio > 1.15 {
		t.Fatalf("a cold restore of the child fetched %.2fx its startup set's stored bytes (%d GETs), want <= 1.15x", ratio, total.Gets)
	}
	checkChainMemory(t, nodeB, child.rec.ID, child.memory)
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// loadavg is the host's load average, printed with every figure.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%.14s", b)
}

// publishGrandchild publishes on r a base, a child and a grandchild whose
// manifest names pages of each of its three layers, as data or as zero
// pages a layer defines; it returns the grandchild's record, its memory
// and the manifest's page offsets.
func publishGrandchild(t *testing.T, r *Repo) (repository.Record, []byte, []int64) {
	t.Helper()
	base := repotest.PublishBase(t, r, 16*testChunkBytes, "")
	child := repotest.PublishChild(t, r, base, repotest.Change{Pages: []int64{1, 5, 9}, Zero: []int64{3, 7}}, "")
	built, mem := repotest.BuildLayer(t, child.Memory, repotest.Change{Pages: []int64{2, 5, 11}, Zero: []int64{1}})
	req := repotest.LayerRequest(t, child.Record, built, "")
	var order []int64
	for _, p := range []int64{11, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 40, 63} {
		order = append(order, p*layers.PageBytes)
	}
	m, err := manifest.Build(child.Record.Layout, order)
	if err != nil {
		t.Fatal(err)
	}
	if req.Manifest, err = manifest.Encode(m); err != nil {
		t.Fatal(err)
	}
	rec := repotest.PublishLayer(t, r, req)
	if rec.StartupPack == nil || rec.StartupPack.LogicalBytes != m.TotalBytes() {
		t.Fatalf("grandchild's startup pack %+v, want one of the manifest's %d bytes", rec.StartupPack, m.TotalBytes())
	}
	return rec, mem, order
}

// readsFromPackOnly reads the pages at offsets of id, page by page, on a
// node with an empty cache under prefix, checks each against mem, and
// that no layer's chunk was fetched for them.
func readsFromPackOnly(t *testing.T, prefix, id string, offsets []int64, mem []byte) {
	t.Helper()
	fresh := chunkyRepo(t, prefix)
	res, rd := resolveMemory(t, fresh, id)
	defer rd.Close()
	before := fresh.RequestStats()
	page := make([]byte, layers.PageBytes)
	for _, off := range offsets {
		if _, err := rd.ReadAt(page, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(page, mem[off:off+layers.PageBytes]) {
			t.Fatalf("page at %d differs from the memory of %s", off, id)
		}
	}
	if got := fresh.RequestStats().Sub(before); got.Gets == 0 {
		t.Fatal("the pages were read without a GET")
	}
	for i, l := range res.Memory.(*repository.ChainSource).Layers() {
		m, ok := l.Data.(*memorySource)
		if !ok {
			continue
		}
		for idx := range m.obj.Size/fresh.cache.BlockBytes() + 1 {
			if fresh.cache.Cached(m.obj.ID, idx) {
				t.Fatalf("reading the pages fetched block %d of layer %d's chunks", idx, i)
			}
		}
	}
}

// TestChainPackServesEveryLayer: a grandchild's startup pack serves the
// manifest's pages of each of its layers, zero pages included, to a node
// with an empty cache, as the grandchild's memory holds them, and no
// layer's chunk is fetched for them.
func TestChainPackServesEveryLayer(t *testing.T) {
	r := chunkyRepo(t, "")
	rec, mem, order := publishGrandchild(t, r)
	readsFromPackOnly(t, r.keys.prefix, rec.ID, order, mem)
}

// TestChainRefinedPack: a refinement attached to a grandchild, adding
// pages spread over its memory, gets a refined pack built through the
// chain, which serves every refined page the same way.
func TestChainRefinedPack(t *testing.T) {
	r := chunkyRepo(t, "")
	rec, mem, _ := publishGrandchild(t, r)
	rec = attachSpreadRefinement(t, r, rec.ID, 8)
	if rec.RefinedPack == nil {
		t.Fatal("the refinement of a chain got no refined pack")
	}
	_, indexKey := refinedPackKeys(r.keys, rec.ID, rec.RefinedPack.ManifestSHA256)
	idx, err := chunkmap.DecodePack(readObject(t, r, indexKey))
	if err != nil {
		t.Fatal(err)
	}
	var pages []int64
	for _, rg := range idx.Ranges {
		for off := rg.Offset; off < rg.Offset+rg.Length; off += layers.PageBytes {
			pages = append(pages, off)
		}
	}
	if len(pages) <= 14 {
		t.Fatalf("the refined pack holds %d pages, want the recorded 14 and the learned ones", len(pages))
	}
	readsFromPackOnly(t, r.keys.prefix, rec.ID, pages, mem)
}
