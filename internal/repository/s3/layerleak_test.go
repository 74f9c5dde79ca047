package s3

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"warmstart/internal/layers"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// tally is what the bucket holds under a prefix, listed for real.
type tally struct {
	objects int
	bytes   int64
}

func tallyOf(t *testing.T, r *Repo) tally {
	t.Helper()
	objs, err := r.list(bg(), r.keys.prefix)
	if err != nil {
		t.Fatal(err)
	}
	var n tally
	for _, o := range objs {
		n.objects++
		n.bytes += o.Size
	}
	return n
}

// unneededKeys lists the bucket under r's prefix for real and returns the
// keys nothing can read any more: artifacts of an id without a record, a
// layer's objects that no record names, a chunk that no chunk map of a
// named layer names, a dependents marker whose child has no record
// naming the owner, a tombstone, a list of abandoned chunks, a lease
// object. Once every publish has ended and every grace has passed the
// answer must be none.
func unneededKeys(t *testing.T, r *Repo) []string {
	t.Helper()
	recs := recordsUnder(t, r)
	needed, maps := map[string]bool{}, map[string]bool{}
	for _, rec := range recs {
		for _, l := range rec.Layers() {
			maps[r.keys.artifact(l.Snapshot, layerChunkMapName(l.Name))] = true
			for _, f := range layerFiles(l.Name) {
				needed[r.keys.artifact(l.Snapshot, f)] = true
			}
		}
	}
	chunks := map[string]bool{}
	for key := range maps {
		if err := r.markList(bg(), key, chunks); err != nil {
			t.Fatal(err)
		}
	}
	var out []string
	for _, k := range keysUnder(t, r) {
		if !neededKey(r, k, recs, needed, chunks) {
			out = append(out, k)
		}
	}
	return out
}

// neededKey decides one key (relative to r's prefix) for unneededKeys.
func neededKey(r *Repo, k string, recs map[string]repository.Record, layerObjs, chunks map[string]bool) bool {
	full := r.keys.prefix + k
	switch {
	case strings.HasPrefix(k, chunksDir):
		return chunks[full]
	case strings.HasPrefix(k, dependentsDir):
		owner, child, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(k, dependentsDir), jsonSuffix), "/")
		rec, ok := recs[child]
		return ok && repository.MarkerOf(owner, false, rec, nil, false) == repository.MarkerLive
	case strings.HasPrefix(k, artifactsDir):
		id, name, _ := strings.Cut(strings.TrimPrefix(k, artifactsDir), "/")
		if _, ok := recs[id]; !ok || name == journalName {
			return false // a journal is a publish's or a flatten's in progress
		}
		isLayer := strings.HasPrefix(name, "layer-") || strings.HasPrefix(name, repository.BaseLayerName+".")
		return !isLayer || layerObjs[full]
	}
	return strings.HasPrefix(k, "catalog/")
}

// recordsUnder reads every record under r's prefix, by id.
func recordsUnder(t *testing.T, r *Repo) map[string]repository.Record {
	t.Helper()
	objs, err := r.list(bg(), r.keys.prefix+"catalog/records/")
	if err != nil {
		t.Fatal(err)
	}
	recs := map[string]repository.Record{}
	for _, o := range objs {
		id, ok := r.keys.idFromRecordKey(o.Key)
		if !ok {
			continue
		}
		rec, _, err := r.getRecord(bg(), id)
		if err != nil {
			t.Fatal(err)
		}
		recs[id] = rec
	}
	return recs
}

// layerKeys are the keys (relative to r's prefix) of the objects of
// layer name of snapshot id the bucket holds.
func layerKeys(t *testing.T, r *Repo, id, name string) []string {
	t.Helper()
	var out []string
	for _, f := range layerFiles(name) {
		out = append(out, strings.TrimPrefix(r.keys.artifact(id, f), r.keys.prefix))
	}
	return present(t, r, out)
}

// memoryFile writes mem to a file of the test's and returns its path.
func memoryFile(t *testing.T, mem []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "memory")
	if err := os.WriteFile(p, mem, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// flattenUnderAPause flattens mid on nodeB (by flatten, whose Expect is
// mid's record) while, after the flatten found no dependents and before
// its new record, nodeA publishes req (a child over mid's record as it
// was read, naming mid's own diff layer). Both must succeed: the child's
// record names the layer the flatten retires, which stays.
func flattenUnderAPause(t *testing.T, nodeA, nodeB *Repo, mid repotest.Lineage, flatten repository.ReplaceMemoryRequest, req repository.LayerPublishRequest) repository.Record {
	t.Helper()
	flatten.Expect = mid.Record
	var child repository.Record
	var pubErr error
	tried := false
	nodeB.layerFault = func(p string) {
		if p != FaultReplaceAfterCheck || tried {
			return
		}
		tried = true
		child, pubErr = publishLayerOn(nodeA, req)
	}
	defer func() { nodeB.layerFault = nil }()
	lease, err := nodeB.LeaseExisting(bg(), mid.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, flatErr := nodeB.ReplaceMemory(bg(), lease, flatten)
	lease.End()
	if !tried || flatErr != nil || pubErr != nil {
		t.Fatalf("flatten under a pause: reached the fault point %v; flatten %v; publish %v", tried, flatErr, pubErr)
	}
	return child
}

// publishLayerOn publishes req on r under a lease of its own.
func publishLayerOn(r *Repo, req repository.LayerPublishRequest) (repository.Record, error) {
	lease, err := r.BeginCapture(bg())
	if err != nil {
		return repository.Record{}, err
	}
	defer lease.End()
	return r.PublishLayer(bg(), lease, req)
}

// TestFlattenedLayerGoesWithItsLastDependent: a flatten that met a child
// published over the record it replaced keeps the layer it retired (the
// child names it), through a snapshot gc. Once that child is deleted, a
// snapshot gc takes the layer's objects, keeping its chunks for the chunk
// grace (a restore of the child resolved before its delete reads its
// memory whole after that gc), and one past the grace takes those: the
// bucket then holds nothing that nothing can read.
func TestFlattenedLayerGoesWithItsLastDependent(t *testing.T) {
	c := newRetiringChain(t)
	nodeA, nodeB, base, mid, retired, built, childMem := c.nodeA, c.nodeB, c.base, c.mid, c.retired, c.built, c.childMem
	whole := repository.ReplaceMemoryRequest{MemoryPath: memoryFile(t, mid.Memory)}
	child := flattenUnderAPause(t, nodeA, nodeB, mid, whole, repotest.LayerRequest(t, mid.Record, built, ""))

	kept := layerKeys(t, nodeA, mid.Record.ID, retired)
	pastGrace := chunkyRepo(t, nodeA.keys.prefix)
	pastGrace.chunkGrace = time.Nanosecond
	snapshotGC(t, pastGrace)
	if got := layerKeys(t, nodeA, mid.Record.ID, retired); !slices.Equal(got, kept) || len(kept) == 0 {
		t.Fatalf("of the retired layer %s the child names, %v of %v left after a snapshot gc", retired, got, kept)
	}
	readsBack(t, nodeA.keys.prefix, child.ID, repotest.SHA256Hex(childMem))
	if left := unneededKeys(t, nodeA); len(left) != 0 {
		t.Fatalf("with the child live the bucket holds unneeded %v", left)
	}

	inFlight, err := chunkyRepo(t, nodeA.keys.prefix).Resolve(bg(), child.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := nodeA.Delete(bg(), child.ID); err != nil {
		t.Fatal(err)
	}
	before := tallyOf(t, nodeA)
	snapshotGC(t, nodeB) // the default chunk grace
	if got := layerKeys(t, nodeA, mid.Record.ID, retired); len(got) != 0 {
		t.Errorf("the retired layer's objects %v stayed once its last dependent was deleted", got)
	}
	if got := repotest.ResolvedMemorySHA256(t, inFlight); got != repotest.SHA256Hex(childMem) {
		t.Errorf("a restore of the child resolved before its delete reads %s, want %s", got, repotest.SHA256Hex(childMem))
	}
	snapshotGC(t, pastGrace)
	after := tallyOf(t, nodeA)
	t.Logf("bucket after the child's delete: %d objects, %d bytes; after snapshot gc: %d objects, %d bytes",
		before.objects, before.bytes, after.objects, after.bytes)
	if left := unneededKeys(t, nodeA); len(left) != 0 {
		t.Errorf("the bucket holds unneeded %v", left)
	}
	for _, l := range []repotest.Lineage{base, mid} {
		readsBack(t, nodeA.keys.prefix, l.Record.ID, repotest.SHA256Hex(l.Memory))
	}
}

// TestRetiredLayerKeptForAPublishInProgress: a child's publish that read
// the record a flatten replaces (registered at it, then stalled) keeps
// the layer the flatten retires through a snapshot gc past every grace,
// then commits and reads back whole.
func TestRetiredLayerKeptForAPublishInProgress(t *testing.T) {
	c := newRetiringChain(t)
	nodeA, nodeB, mid, retired, built, childMem := c.nodeA, c.nodeB, c.mid, c.retired, c.built, c.childMem
	req := repotest.LayerRequest(t, mid.Record, built, "")

	registered, resume := make(chan struct{}), make(chan struct{})
	nodeA.layerFault = func(p string) {
		if p == FaultLayerAfterMarkers {
			close(registered)
			<-resume
		}
	}
	type published struct {
		rec repository.Record
		err error
	}
	done := make(chan published, 1)
	nodeB.layerFault = func(p string) {
		if p != FaultReplaceAfterCheck {
			return
		}
		go func() {
			rec, err := publishLayerOn(nodeA, req)
			done <- published{rec, err}
		}()
		<-registered
	}
	memPath := filepath.Join(t.TempDir(), "mid.mem")
	if err := os.WriteFile(memPath, mid.Memory, 0o600); err != nil {
		t.Fatal(err)
	}
	lease, err := nodeB.LeaseExisting(bg(), mid.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, flatErr := nodeB.ReplaceMemory(bg(), lease, repository.ReplaceMemoryRequest{Expect: mid.Record, MemoryPath: memPath})
	lease.End()
	if flatErr != nil {
		close(resume)
		t.Fatalf("flatten: %v", flatErr)
	}
	kept := layerKeys(t, nodeA, mid.Record.ID, retired)
	pastGrace := chunkyRepo(t, nodeA.keys.prefix)
	pastGrace.chunkGrace = time.Nanosecond
	snapshotGC(t, pastGrace)
	got := layerKeys(t, nodeA, mid.Record.ID, retired)
	close(resume)
	if !slices.Equal(got, kept) || len(kept) == 0 {
		t.Errorf("a snapshot gc while a child registered before the flatten's record publishes left %v of the retired layer's %v", got, kept)
	}
	p := <-done
	if p.err != nil {
		t.Fatalf("the child's publish: %v", p.err)
	}
	readsBack(t, nodeA.keys.prefix, p.rec.ID, repotest.SHA256Hex(childMem))
}

// mergedLayer builds one layer holding every page where mem differs from
// base, with mem's bytes: a flatten's merged layer.
func mergedLayer(t *testing.T, base, mem []byte) *layers.Built {
	t.Helper()
	b, err := layers.NewBuilder(t.TempDir(), int64(len(base)), nil)
	if err != nil {
		t.Fatal(err)
	}
	for p := int64(0); p < int64(len(base))/layers.PageBytes; p++ {
		page := mem[p*layers.PageBytes : (p+1)*layers.PageBytes]
		if !bytes.Equal(page, base[p*layers.PageBytes:(p+1)*layers.PageBytes]) {
			if err := b.Add(p, page); err != nil {
				t.Fatal(err)
			}
		}
	}
	built, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return built
}

// flattenDuringCollection builds a chain of three on one node and
// flattens its leaf from a second one, running a snapshot gc by
// collector (made from the chain's prefix by newCollector) after the
// flatten stored its merged layer and before the record naming it. It
// returns the node the chain was published from, the leaf, the flattened
// record and what that gc did.
func flattenDuringCollection(t *testing.T, newCollector func(prefix string) *Repo) (*Repo, repotest.Lineage, repository.Record, GCStats) {
	t.Helper()
	run := flattenWhileCollecting(t, newCollector, func(flattener *Repo, collect func()) {
		flattener.layerFault = func(p string) {
			if p == FaultReplaceBeforeRecord {
				collect()
			}
		}
	})
	if run.err != nil {
		t.Fatalf("flatten: %v", run.err)
	}
	return run.nodeA, run.leaf, run.flat, run.during
}

// flattenRun is what flattenWhileCollecting saw.
type flattenRun struct {
	nodeA  *Repo
	leaf   repotest.Lineage
	flat   repository.Record
	during GCStats
	err    error
}

// flattenWhileCollecting builds a chain of three on one node and flattens
// its leaf from a second one (the flattener), on which hook installs the
// point where collect, a snapshot gc by collector (made from the chain's
// prefix by newCollector), runs. The flatten's error is returned, not
// fatal.
func flattenWhileCollecting(t *testing.T, newCollector func(prefix string) *Repo, hook func(flattener *Repo, collect func())) flattenRun {
	t.Helper()
	nodeA, nodeB, base := twoNodesOverABase(t)
	mid := repotest.PublishChild(t, nodeA, base, repotest.Change{Pages: []int64{1, 5}}, "")
	leaf := repotest.PublishChild(t, nodeA, mid, repotest.Change{Pages: []int64{2, 5, 30}}, "")
	collector := newCollector(nodeA.keys.prefix)
	run := flattenRun{nodeA: nodeA, leaf: leaf}
	hook(nodeB, func() { run.during = snapshotGC(t, collector) })
	lease, err := nodeB.LeaseExisting(bg(), leaf.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	run.flat, run.err = nodeB.ReplaceMemory(bg(), lease, repository.ReplaceMemoryRequest{Expect: leaf.Record, Layer: mergedLayer(t, base.Memory, leaf.Memory)})
	lease.End()
	return run
}

// TestCollectionKeepsAFlattensNewLayer: a snapshot gc on another node past
// every grace, run while a flatten has stored its merged layer and not
// yet the record naming it, retires nothing (the layer is named by no
// record yet, but the flatten's lease is held); the flatten commits and
// the snapshot reads back, and the layer it retired goes.
func TestCollectionKeepsAFlattensNewLayer(t *testing.T) {
	var pastGrace *Repo
	nodeA, leaf, flat, during := flattenDuringCollection(t, func(prefix string) *Repo {
		pastGrace = chunkyRepo(t, prefix)
		pastGrace.chunkGrace = time.Nanosecond
		return pastGrace
	})
	if during.RetiredLayers != 0 || flat.Depth() != 1 {
		t.Fatalf("a collection during the flatten retired %d layers; the flattened record has depth %d", during.RetiredLayers, flat.Depth())
	}
	readsBack(t, nodeA.keys.prefix, leaf.Record.ID, repotest.SHA256Hex(leaf.Memory))
	snapshotGC(t, pastGrace)
	if left := unneededKeys(t, nodeA); len(left) != 0 {
		t.Errorf("the bucket holds unneeded %v", left)
	}
	readsBack(t, nodeA.keys.prefix, leaf.Record.ID, repotest.SHA256Hex(leaf.Memory))
}

// TestCollectionKeepsASilentFlattensNewLayer: a collector cannot tell a
// flattener whose lease renewals have failed (or whose lease object its
// own clock, running ahead of the store's, reads as old) from a dead one
// by the lease TTL. A snapshot gc run while such a flatten has stored its
// merged layer, and not yet the record naming it, must still leave that
// layer: the flatten then writes its record, and the snapshot must read
// back whole. Here the collector's lease TTL is cut to nothing, so the
// flatten's lease object, written moments ago, reads as expired to it.
func TestCollectionKeepsASilentFlattensNewLayer(t *testing.T) {
	nodeA, leaf, _, during := flattenDuringCollection(t, func(prefix string) *Repo {
		collector := chunkyRepo(t, prefix)
		collector.leaseTTL = time.Nanosecond
		return collector
	})
	if during.RetiredLayers != 0 {
		t.Errorf("a collection during the flatten retired %d layers", during.RetiredLayers)
	}
	readsBack(t, nodeA.keys.prefix, leaf.Record.ID, repotest.SHA256Hex(leaf.Memory))
}

// TestFlattenStalledPastTheGraceWritesNoRecord: a flatten that stalled
// for longer than the abandoned grace between storing its merged layer
// and writing the record naming it looks dead to a snapshot gc, which
// retires that layer. The flatten must then refuse with ErrLeaseEnded
// and leave the snapshot's record as it was (never naming reclaimed
// data), and the bucket must hold nothing unneeded after the next gc.
// The stall is the collector's grace cut to nothing; the second case is
// a flatten whose record itself lands slowly (its own grace cut to
// nothing) after the collector revoked its lease: it takes the record
// back.
func TestFlattenStalledPastTheGraceWritesNoRecord(t *testing.T) {
	cases := map[string]func(flattener *Repo, collect func()){
		"stalled before its record": func(flattener *Repo, collect func()) {
			flattener.layerFault = func(p string) {
				if p == FaultReplaceBeforeRecord {
					collect()
				}
			}
		},
		"record landed late": func(flattener *Repo, collect func()) {
			flattener.abandonedGrace = time.Nanosecond
			flattener.afterConfirmLease = collect
		},
	}
	for name, hook := range cases {
		t.Run(name, func(t *testing.T) {
			var collector *Repo
			run := flattenWhileCollecting(t, func(prefix string) *Repo {
				collector = chunkyRepo(t, prefix)
				collector.abandonedGrace = time.Nanosecond
				return collector
			}, hook)
			if !errors.Is(run.err, repository.ErrLeaseEnded) {
				t.Fatalf("a flatten whose new layer a snapshot gc retired returned %v (depth %d), want ErrLeaseEnded", run.err, run.flat.Depth())
			}
			t.Logf("the flatten: %v; the gc during it: %+v", run.err, run.during)
			got, err := run.nodeA.Get(bg(), run.leaf.Record.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.MemoryIdentity() != run.leaf.Record.MemoryIdentity() || got.Depth() != run.leaf.Record.Depth() {
				t.Errorf("the refused flatten left a record of depth %d naming other memory than the leaf's (depth %d)", got.Depth(), run.leaf.Record.Depth())
			}
			readsBack(t, run.nodeA.keys.prefix, run.leaf.Record.ID, repotest.SHA256Hex(run.leaf.Memory))
			collector.chunkGrace = time.Nanosecond
			snapshotGC(t, collector)
			if left := unneededKeys(t, run.nodeA); len(left) != 0 {
				t.Errorf("the bucket holds unneeded %v", left)
			}
			readsBack(t, run.nodeA.keys.prefix, run.leaf.Record.ID, repotest.SHA256Hex(run.leaf.Memory))
		})
	}
}

// TestFailedFlattenKeepsAKeptLayersChunks: a flatten that met a child
// published over the record it replaced kept the layer it retired; once
// that child is deleted, a later flatten of the same snapshot that fails
// after storing its memory must not remove that layer's chunk map
// without a tombstone: a restore of the child resolved before its delete
// reads those chunks, which a collection must keep for the chunk grace.
// Everything then goes by snapshot gc alone.
func TestFailedFlattenKeepsAKeptLayersChunks(t *testing.T) {
	nodeA, nodeB, base := twoNodesOverABase(t)
	mid := repotest.PublishChild(t, nodeA, base, repotest.Change{Pages: []int64{1, 5}}, "")
	leaf := repotest.PublishChild(t, nodeA, mid, repotest.Change{Pages: []int64{2, 5, 30}}, "")
	kept := leaf.Record.MemoryLayers[len(leaf.Record.MemoryLayers)-1].Name
	built, kidMem := repotest.BuildLayer(t, leaf.Memory, repotest.Change{Pages: []int64{3, 30}})
	merged := repository.ReplaceMemoryRequest{Layer: mergedLayer(t, base.Memory, leaf.Memory)}
	kid := flattenUnderAPause(t, nodeA, nodeB, leaf, merged, repotest.LayerRequest(t, leaf.Record, built, ""))
	keptChunks := map[string]bool{}
	if err := nodeA.markList(bg(), nodeA.keys.artifact(leaf.Record.ID, layerChunkMapName(kept)), keptChunks); err != nil || len(keptChunks) == 0 {
		t.Fatalf("the kept layer %s names chunks %v (%v)", kept, keptChunks, err)
	}
	inFlight, err := chunkyRepo(t, nodeA.keys.prefix).Resolve(bg(), kid.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := nodeA.Delete(bg(), kid.ID); err != nil {
		t.Fatal(err)
	}

	// A whole flatten of the leaf fails after storing its memory: its
	// lease is revoked before its record.
	flat, err := nodeA.Get(bg(), leaf.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	nodeB.layerFault = func(p string) {
		if p == FaultReplaceBeforeRecord {
			revokeLeasesOf(t, nodeB, leaf.Record.ID)
		}
	}
	lease, err := nodeB.LeaseExisting(bg(), leaf.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = nodeB.ReplaceMemory(bg(), lease, repository.ReplaceMemoryRequest{Expect: flat, MemoryPath: memoryFile(t, leaf.Memory)})
	lease.End()
	if !errors.Is(err, repository.ErrLeaseEnded) {
		t.Fatalf("a flatten whose lease was revoked before its record: %v", err)
	}
	if left := layerKeys(t, nodeA, leaf.Record.ID, repository.BaseLayerName); len(left) != 0 {
		t.Errorf("the failed flatten left its memory's objects %v", left)
	}
	mk, err := chunkyRepo(t, nodeA.keys.prefix).markChunks(bg())
	if err != nil {
		t.Fatal(err)
	}
	for key := range keptChunks {
		if !mk.live[key] {
			t.Errorf("after the failed flatten's clean-up no chunk map or young tombstone names the kept layer's chunk %s", key)
		}
	}
	if got := repotest.ResolvedMemorySHA256(t, inFlight); got != repotest.SHA256Hex(kidMem) {
		t.Errorf("a restore of the child resolved before its delete reads %s, want %s", got, repotest.SHA256Hex(kidMem))
	}

	collector := chunkyRepo(t, nodeA.keys.prefix)
	collector.abandonedGrace = time.Nanosecond // the revoked lease object's
	snapshotGC(t, collector)
	collector.chunkGrace = time.Nanosecond
	snapshotGC(t, collector)
	if left := unneededKeys(t, nodeA); len(left) != 0 {
		t.Errorf("the bucket holds unneeded %v", left)
	}
	readsBack(t, nodeA.keys.prefix, leaf.Record.ID, repotest.SHA256Hex(leaf.Memory))
}

// revokeLeasesOf revokes every lease object of id, as a collector
// taking its holders for dead does.
func revokeLeasesOf(t *testing.T, r *Repo, id string) {
	t.Helper()
	objs, err := r.list(bg(), r.keys.leasesOf(id))
	if err != nil || len(objs) == 0 {
		t.Fatalf("lease objects of %s: %v, %v", id, objs, err)
	}
	for _, o := range objs {
		if revoked, err := r.revokeLease(bg(), id, o); err != nil || !revoked {
			t.Fatalf("revoke %s: %v, %v", o.Key, revoked, err)
		}
	}
}

// TestCrashedFlattenLeavesNothingAfterCollection: a flatten that dies
// after storing its new memory and before its record (here its goroutine
// ends there, and its lease with it) leaves that memory, named by no
// record, and its journal: snapshot gc past the graces must take them
// all, for a merged layer and for a whole memory file alike, and the
// snapshot reads back as it was.
func TestCrashedFlattenLeavesNothingAfterCollection(t *testing.T) {
	for _, whole := range []bool{false, true} {
		t.Run(map[bool]string{false: "merged layer", true: "whole memory"}[whole], func(t *testing.T) {
			nodeA, nodeB, base := twoNodesOverABase(t)
			mid := repotest.PublishChild(t, nodeA, base, repotest.Change{Pages: []int64{1, 5}}, "")
			leaf := repotest.PublishChild(t, nodeA, mid, repotest.Change{Pages: []int64{2, 5, 30}}, "")
			req := repository.ReplaceMemoryRequest{Expect: leaf.Record, Layer: mergedLayer(t, base.Memory, leaf.Memory)}
			if whole {
				req = repository.ReplaceMemoryRequest{Expect: leaf.Record, MemoryPath: memoryFile(t, leaf.Memory)}
			}
			nodeB.layerFault = func(p string) {
				if p == FaultReplaceBeforeRecord {
					runtime.Goexit()
				}
			}
			lease, err := nodeB.LeaseExisting(bg(), leaf.Record.ID)
			if err != nil {
				t.Fatal(err)
			}
			died := make(chan struct{})
			go func() {
				defer close(died)
				_, _ = nodeB.ReplaceMemory(bg(), lease, req)
			}()
			<-died
			lease.End()
			before := unneededKeys(t, nodeA)
			collector := chunkyRepo(t, nodeA.keys.prefix)
			collector.abandonedGrace = time.Nanosecond
			snapshotGC(t, collector)
			collector.chunkGrace = time.Nanosecond
			snapshotGC(t, collector)
			if left := unneededKeys(t, nodeA); len(left) != 0 {
				t.Errorf("of what the dead flatten left (%v), the bucket still holds %v", before, left)
			}
			readsBack(t, nodeA.keys.prefix, leaf.Record.ID, repotest.SHA256Hex(leaf.Memory))
		})
	}
}
