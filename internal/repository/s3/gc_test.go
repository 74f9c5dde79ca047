package s3

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"warmstart/internal/chunkmap"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// sharingInputs writes a memory file equal to in's but for its last three
// chunks, so the two share five chunks (one of them zero).
func sharingInputs(t *testing.T, in repotest.Inputs, seed uint64) repotest.Inputs {
	t.Helper()
	other := chunkyInputs(t, seed)
	a, err := os.ReadFile(in.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(other.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	copy(b[:5*testChunkBytes], a[:5*testChunkBytes])
	if err := os.WriteFile(other.MemoryPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	other.MemorySHA256 = repotest.SHA256Hex(b)
	return other
}

func keysOfMemory(t *testing.T, r *Repo, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for off := 0; off < len(data); off += testChunkBytes {
		if c := data[off : off+testChunkBytes]; !chunkmap.IsZero(c) {
			out[r.keys.chunk(chunkmap.Sum(c))] = true
		}
	}
	return out
}

func readsBack(t *testing.T, prefix string, id, want string) {
	t.Helper()
	node := chunkyRepo(t, prefix)
	res, err := node.Resolve(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got := repotest.ResolvedMemorySHA256(t, res); got != want {
		t.Fatalf("%s reads back as %s, want %s", id, got, want)
	}
}

// TestGarbageCollection deletes one of two snapshots that share chunks:
// within the grace nothing goes (a restore of the deleted one may still
// run somewhere); after it, exactly the chunks only the deleted one held
// go, with its tombstone, and the other still reads right.
func TestGarbageCollection(t *testing.T) {
	r := chunkyRepo(t, "")
	inA := chunkyInputs(t, 11)
	inB := sharingInputs(t, inA, 12)
	a, _ := repotest.PublishInputs(t, r, inA, "")
	b, _ := repotest.PublishInputs(t, r, inB, "")
	if err := r.Delete(bg(), a.ID); err != nil {
		t.Fatal(err)
	}
	st, err := r.CollectGarbage(bg())
	if err != nil {
		t.Fatal(err)
	}
	if st.Removed != 0 || st.Chunks != 9 {
		t.Fatalf("within the grace: %+v, want 9 chunks, none removed", st)
	}
	readsBack(t, r.keys.prefix, b.ID, inB.MemorySHA256)

	r.chunkGrace = time.Nanosecond
	st, err = r.CollectGarbage(bg())
	if err != nil {
		t.Fatal(err)
	}
	onlyA := keysOfMemory(t, r, inA.MemoryPath)
	for k := range keysOfMemory(t, r, inB.MemoryPath) {
		delete(onlyA, k)
	}
	if st.Removed != len(onlyA) || st.Tombstones != 1 || st.Live != 6 {
		t.Fatalf("after the grace: %+v, want %d removed, 6 live, 1 tombstone", st, len(onlyA))
	}
	left := strings.Join(keysUnder(t, r), " ")
	for k := range onlyA {
		if strings.Contains(left, strings.TrimPrefix(k, r.keys.prefix)) {
			t.Fatalf("chunk %s of the deleted snapshot is left", k)
		}
	}
	readsBack(t, r.keys.prefix, b.ID, inB.MemorySHA256)
}

// TestDeleteOnOneNodeWhileAnotherReads: node B resolves a snapshot, node A
// deletes it and collects garbage; B still reads every byte right, from
// chunks the tombstone keeps.
func TestDeleteOnOneNodeWhileAnotherReads(t *testing.T) {
	nodeA := chunkyRepo(t, "")
	in := chunkyInputs(t, 13)
	rec, _ := repotest.PublishInputs(t, nodeA, in, "")
	nodeB := chunkyRepo(t, nodeA.keys.prefix)
	res, err := nodeB.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := nodeA.Delete(bg(), rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := nodeA.CollectGarbage(bg()); err != nil {
		t.Fatal(err)
	}
	if got := repotest.ResolvedMemorySHA256(t, res); got != in.MemorySHA256 {
		t.Fatalf("node B read %s after the delete on A, want %s", got, in.MemorySHA256)
	}
}

// twoNodesAfterDelete publishes a snapshot X on node A (seed), deletes it
// and lets its grace pass, so that its chunks and tombstone are old; it
// returns A, a node B on the same prefix (both with that grace), X's id
// and the inputs of a snapshot Y that shares chunks with X.
func twoNodesAfterDelete(t *testing.T, seed uint64) (nodeA, nodeB *Repo, xID string, inY repotest.Inputs) {
	t.Helper()
	const grace = 2 * time.Second
	nodeA = chunkyRepo(t, "")
	nodeA.chunkGrace = grace
	inX := chunkyInputs(t, seed)
	x, _ := repotest.PublishInputs(t, nodeA, inX, "")
	if err := nodeA.Delete(bg(), x.ID); err != nil {
		t.Fatal(err)
	}
	// The grace is what is tested: X's chunks and tombstone must age.
	time.Sleep(grace + time.Second)
	nodeB = chunkyRepo(t, nodeA.keys.prefix)
	nodeB.chunkGrace = grace
	return nodeA, nodeB, x.ID, sharingInputs(t, inX, seed+1)
}

// TestCollectWhileAnotherNodePublishes: node A collects garbage in a loop
// while node B publishes a snapshot sharing chunks with one A deleted
// after its grace had passed. B's publish finds those chunks old and
// uploads them again, its new chunks are young: nothing of B's is lost.
func TestCollectWhileAnotherNodePublishes(t *testing.T) {
	nodeA, nodeB, xID, inY := twoNodesAfterDelete(t, 14)
	ctx, cancel := context.WithCancel(bg())
	var wg sync.WaitGroup
	var collectErr error
	wg.Go(func() {
		for ctx.Err() == nil {
			if _, err := nodeA.CollectGarbage(ctx); err != nil && ctx.Err() == nil {
				collectErr = err
				return
			}
		}
	})
	y, _ := repotest.PublishInputs(t, nodeB, inY, "")
	cancel()
	wg.Wait()
	if collectErr != nil {
		t.Fatal(collectErr)
	}
	if _, err := nodeA.CollectGarbage(bg()); err != nil {
		t.Fatal(err)
	}
	readsBack(t, nodeA.keys.prefix, y.ID, inY.MemorySHA256)
	if _, err := nodeA.Get(bg(), xID); err == nil || !strings.Contains(err.Error(), repository.ErrNotFound.Error()) {
		t.Fatalf("deleted snapshot: %v", err)
	}
}

// TestPublishWaitsForACollectionThatMissedItsMap: a collection has read
// the chunk maps and checked an old chunk's age; before it removes the
// chunk, another node publishes a snapshot holding it (uploading it
// again, storing its map, confirming). The publish must not write its
// record until that collection has ended, and must then find the chunk
// gone and upload it again: its snapshot reads back whole.
func TestPublishWaitsForACollectionThatMissedItsMap(t *testing.T) {
	nodeA, nodeB, _, inY := twoNodesAfterDelete(t, 16)
	_, y := collectRacingAPublish(t, nodeA, nodeB, inY)
	readsBack(t, nodeA.keys.prefix, y.ID, inY.MemorySHA256)
}

// collectRacingAPublish collects garbage on nodeA; right before the
// collection removes a chunk of inY's memory, nodeB publishes inY, and the
// removal waits until that publish waits for the collection (or, without
// that wait, has ended). It returns the collection's stats and the
// publish's record.
func collectRacingAPublish(t *testing.T, nodeA, nodeB *Repo, inY repotest.Inputs) (GCStats, repository.Record) {
	t.Helper()
	shared := keysOfMemory(t, nodeA, inY.MemoryPath)
	waiting := make(chan struct{})
	var waitOnce sync.Once
	nodeB.awaitingCollection = func() { waitOnce.Do(func() { close(waiting) }) }
	published := make(chan repository.Record, 1)
	var raced sync.Once
	nodeA.beforeRemoveChunk = func(key string) {
		if !shared[key] {
			return
		}
		raced.Do(func() {
			go func() {
				rec, _ := repotest.PublishInputs(t, nodeB, inY, "")
				published <- rec
			}()
			// Without the wait the publish ends here, before the removal.
			select {
			case <-waiting:
			case rec := <-published:
				published <- rec
			}
		})
	}
	st, err := nodeA.CollectGarbage(bg())
	if err != nil {
		t.Fatal(err)
	}
	return st, <-published
}

// failPublish publishes in on r and makes it fail right before its record
// (the context is cancelled): its chunks stay, listed as abandoned.
func failPublish(t *testing.T, r *Repo, in repotest.Inputs) {
	t.Helper()
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	ctx, cancel := context.WithCancel(bg())
	defer cancel()
	r.beforeRecord = cancel
	_, err = r.Publish(ctx, lease, in.Request(""))
	r.beforeRecord = nil
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("publish: %v, want context.Canceled", err)
	}
}

// TestFailedPublishesChunksGoAtTheNextCollection: a publish that failed
// before its record leaves its chunks, and the next collection removes
// those no snapshot holds at once, under the default chunk grace, while
// those a published snapshot shares stay and it still reads right.
func TestFailedPublishesChunksGoAtTheNextCollection(t *testing.T) {
	r := chunkyRepo(t, "")
	inA := chunkyInputs(t, 81)
	a, _ := repotest.PublishInputs(t, r, inA, "")
	inB := sharingInputs(t, inA, 82)
	failPublish(t, r, inB)
	onlyB := map[string]bool{}
	for _, k := range chunkKeysOf(t, r, inB.MemoryPath) {
		onlyB[k] = true
	}
	ofA := chunkKeysOf(t, r, inA.MemoryPath)
	for _, k := range ofA {
		delete(onlyB, k)
	}
	if got := len(present(t, r, slices.Collect(maps.Keys(onlyB)))); got != len(onlyB) {
		t.Fatalf("the failed publish stored %d of its %d own chunks: the test needs all", got, len(onlyB))
	}
	st, err := r.CollectGarbage(bg())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("collection: %+v", st)
	if got := present(t, r, slices.Collect(maps.Keys(onlyB))); len(got) != 0 || st.Abandoned != len(onlyB) {
		t.Fatalf("the failed publish's own chunks left: %v (%d removed as abandoned, want %d)", got, st.Abandoned, len(onlyB))
	}
	if got := present(t, r, ofA); !slices.Equal(got, ofA) {
		t.Fatalf("of the published snapshot's chunks %v, %v stayed", ofA, got)
	}
	readsBack(t, r.keys.prefix, a.ID, inA.MemorySHA256)
}

// TestPublishReusingAnAbandonedChunkWaitsForTheCollection: a collection
// has read the journals and is about to remove a chunk a failed publish
// left; meanwhile another node publishes a snapshot holding that chunk,
// names it in its journal (too late for this collection), finds it in the
// bucket and stores its map. The publish must wait for the collection
// before its record, then find the chunk gone and upload it again: its
// snapshot reads back whole.
func TestPublishReusingAnAbandonedChunkWaitsForTheCollection(t *testing.T) {
	nodeA := chunkyRepo(t, "")
	nodeB := chunkyRepo(t, nodeA.keys.prefix)
	inX := chunkyInputs(t, 83)
	failPublish(t, nodeA, inX)
	inY := sharingInputs(t, inX, 84)
	st, y := collectRacingAPublish(t, nodeA, nodeB, inY)
	if st.Abandoned == 0 {
		t.Fatalf("the collection removed no abandoned chunk: %+v", st)
	}
	if nodeB.ChunksSkipped() == 0 {
		t.Fatal("the racing publish reused no chunk of the failed one")
	}
	readsBack(t, nodeA.keys.prefix, y.ID, inY.MemorySHA256)
}
