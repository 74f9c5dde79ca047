package s3

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/chunkmap"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// killMidPublish starts a publish of in by a child process on the
// repository o describes and kills it with SIGKILL once half of the
// memory is stored; it returns the snapshot's id and when the child died.
func killMidPublish(t *testing.T, o Options, in repotest.Inputs) (string, time.Time) {
	t.Helper()
	desc, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	c := repotest.StartChild(t, "publish-midway", string(desc), repotest.PublishEnv(in, ""), nil)
	id := c.Ready(t)
	if err := c.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, sig := c.Wait(t); sig != syscall.SIGKILL {
		t.Fatalf("publisher ended by %v, not SIGKILL: %s", sig, c.Stderr())
	}
	return id, time.Now()
}

// snapshotGC is `warmstart snapshot gc` on r: a sweep, then a collection,
// whose stats it returns.
func snapshotGC(t *testing.T, r *Repo) GCStats {
	t.Helper()
	if err := r.Sweep(bg()); err != nil {
		t.Fatal(err)
	}
	st, err := r.CollectGarbage(bg())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("collection: %+v", st)
	return st
}

// chunkKeysOf returns the keys of the non-zero chunks of the memory file
// at path, cut as r cuts them.
func chunkKeysOf(t *testing.T, r *Repo, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for off := int64(0); off < int64(len(data)); off += r.chunkBytes {
		c := data[off:min(off+r.chunkBytes, int64(len(data)))]
		if !chunkmap.IsZero(c) {
			out = append(out, strings.TrimPrefix(r.keys.chunk(chunkmap.Sum(c)), r.keys.prefix))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// present returns those of keys the bucket holds under r's prefix.
func present(t *testing.T, r *Repo, keys []string) []string {
	t.Helper()
	all := keysUnder(t, r)
	var out []string
	for _, k := range keys {
		if slices.Contains(all, k) {
			out = append(out, k)
		}
	}
	return out
}

// artifactKeys returns the keys of id's artifacts and lease objects.
func artifactKeys(t *testing.T, r *Repo, id string) []string {
	t.Helper()
	var out []string
	for _, k := range snapshotKeys(t, r) {
		if strings.Contains(k, id) {
			out = append(out, k)
		}
	}
	return out
}

// TestAbandonedPublishReclaimedLivePublishKept kills a process half way
// through a publish (issue 27, failure 6: a killed publish left its
// objects, and its chunks, for a day): its objects stay while they may be
// a slow publisher's, and once its lease has gone unwritten for the
// abandoned grace a sweep and a collection remove them and its chunks,
// while a publish of this process stalled half way all along, begun
// before the grace and with chunks older than the chunk grace, keeps every
// object: its live lease protects its artifacts, its journal its chunks.
// It then completes.
func TestAbandonedPublishReclaimedLivePublishKept(t *testing.T) {
	needServer(t)
	o := chunkyOptions(t, server.Endpoint, "")
	o.LeaseTTL, o.AbandonedGrace, o.ChunkGrace = time.Second, 3*time.Second, time.Second
	r := openWith(t, o)
	killedIn := chunkyInputs(t, 61)
	killed, died := killMidPublish(t, o, killedIn)
	left := artifactKeys(t, r, killed)
	killedChunks := present(t, r, chunkKeysOf(t, r, killedIn.MemoryPath))
	if len(left) == 0 || len(killedChunks) == 0 {
		t.Fatalf("the killed publish left %v and chunks %v: the test needs both", left, killedChunks)
	}
	// Within the grace the publisher may only be slow.
	if err := r.Sweep(bg()); err != nil {
		t.Fatal(err)
	}
	if time.Since(died) < r.abandonedGrace {
		if got := artifactKeys(t, r, killed); !slices.Equal(got, left) {
			t.Fatalf("a sweep within the grace left %v of %v", got, left)
		}
	}

	liveIn := chunkyInputs(t, 62)
	lease := beginCapture(t, r)
	began := time.Now()
	stalled := repotest.StallPublish(t, r, lease, liveIn.Request(""))
	defer stalled.Resume() // before lease.End, which waits for it
	liveKeys := artifactKeys(t, r, lease.SnapshotID())
	liveChunks := present(t, r, chunkKeysOf(t, r, liveIn.MemoryPath))
	if len(liveChunks) == 0 {
		t.Fatal("the live publish stalled before storing a chunk")
	}

	// Past the killed one's grace, and past the live one's grace and
	// chunk grace too: only its lease keeps the live publish.
	waitUntil(t, 30*time.Second, func() bool {
		return time.Since(died) > r.abandonedGrace+time.Second && time.Since(began) > r.abandonedGrace+time.Second
	})
	st := snapshotGC(t, r)
	if got := artifactKeys(t, r, killed); len(got) != 0 {
		t.Errorf("the killed publish's objects %v stayed", got)
	}
	if got := present(t, r, killedChunks); len(got) != 0 {
		t.Errorf("the killed publish's chunks %v stayed", got)
	}
	if got := present(t, r, liveKeys); !slices.Equal(got, liveKeys) {
		t.Errorf("of the live publish's objects %v, %v stayed", liveKeys, got)
	}
	if got := present(t, r, liveChunks); !slices.Equal(got, liveChunks) {
		t.Errorf("of the live publish's chunks %v, %v stayed", liveChunks, got)
	}
	if st.Publishing < len(liveChunks) {
		t.Errorf("the collection kept %d chunks for publishes in progress, want the live one's %d", st.Publishing, len(liveChunks))
	}

	if err := stalled.Wait(); err != nil {
		t.Fatalf("the live publish after the collection: %v", err)
	}
	readsBack(t, r.keys.prefix, lease.SnapshotID(), liveIn.MemorySHA256)
}

// TestRevokedPublishWritesNoRecord: a publisher whose lease a collector
// revoked (it looked dead for the abandoned grace: a stalled process)
// writes no record, fails with ErrLeaseEnded and removes what it wrote.
func TestRevokedPublishWritesNoRecord(t *testing.T) {
	r := chunkyRepo(t, "")
	in := chunkyInputs(t, 63)
	lease := beginCapture(t, r)
	id := lease.SnapshotID()
	r.beforeRecord = func() {
		objs, err := r.list(bg(), r.keys.leasesOf(id))
		if err != nil || len(objs) != 1 {
			t.Errorf("lease objects of %s: %v, %v", id, objs, err)
			return
		}
		if revoked, err := r.revokeLease(bg(), id, objs[0]); err != nil || !revoked {
			t.Errorf("revoke: %v, %v", revoked, err)
		}
	}
	_, err := r.Publish(bg(), lease, in.Request("revoked"))
	if !errors.Is(err, repository.ErrLeaseEnded) {
		t.Fatalf("Publish under a revoked lease: %v, want ErrLeaseEnded", err)
	}
	if _, err := r.Get(bg(), id); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("Get after the revoked publish: %v", err)
	}
	if _, err := r.ResolveAlias(bg(), "revoked"); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("alias of the revoked publish: %v", err)
	}
	for _, k := range artifactKeys(t, r, id) {
		if strings.HasPrefix(k, artifactsDir) {
			t.Errorf("the revoked publish left %s", k)
		}
	}
}

// TestKilledPublishersChunksGoAfterTheAbandonedGrace kills a publisher
// half way (issue 27, failure 6: a kill -9 mid-upload left its chunks for
// the chunk grace, hours) and, under the default chunk grace, checks that
// a sweep and a collection once the abandoned grace has passed remove the
// chunks only it held, while a publish begun before them that reuses one
// of its chunks keeps that chunk, then commits a record whose every chunk
// is in the bucket and whose memory reads back right.
func TestKilledPublishersChunksGoAfterTheAbandonedGrace(t *testing.T) {
	needServer(t)
	o := chunkyOptions(t, server.Endpoint, "")
	o.LeaseTTL, o.AbandonedGrace = time.Second, 3*time.Second
	r := openWith(t, o)
	if r.chunkGrace != ChunkGrace {
		t.Fatalf("chunk grace %v: the test is of the default", r.chunkGrace)
	}
	killedIn := chunkyInputs(t, 71)
	killed, died := killMidPublish(t, o, killedIn)
	left := present(t, r, chunkKeysOf(t, r, killedIn.MemoryPath))
	if len(left) < 2 {
		t.Fatalf("the killed publish left chunks %v: the test needs two", left)
	}
	liveIn, shared := reusingOne(t, r, killedIn, left[0], 72)
	killedOnly := left[1:]

	lease := beginCapture(t, r)
	stalled := repotest.StallPublish(t, r, lease, liveIn.Request(""))
	defer stalled.Resume() // before lease.End, which waits for it
	// Every chunk of the stalled publish has been looked for once it has
	// found the shared one in the bucket.
	waitUntil(t, 30*time.Second, func() bool { return r.ChunksSkipped() > 0 })

	waitUntil(t, 30*time.Second, func() bool { return time.Since(died) > r.abandonedGrace+time.Second })
	st := snapshotGC(t, r)
	if got := artifactKeys(t, r, killed); len(got) != 0 {
		t.Errorf("the killed publish's objects %v stayed", got)
	}
	if got := present(t, r, killedOnly); len(got) != 0 || st.Abandoned != len(killedOnly) {
		t.Errorf("of the chunks only the killed publish held, %v stayed for the chunk grace (%d removed as abandoned, want %d)",
			got, st.Abandoned, len(killedOnly))
	}
	if got := present(t, r, []string{shared}); len(got) != 1 {
		t.Errorf("the chunk the live publish reuses, %s, was removed", shared)
	}

	if err := stalled.Wait(); err != nil {
		t.Fatalf("the live publish after the collection: %v", err)
	}
	all := chunkKeysOf(t, r, liveIn.MemoryPath)
	if got := present(t, r, all); !slices.Equal(got, all) {
		t.Fatalf("the live publish's record names chunks %v, the bucket holds %v", all, got)
	}
	readsBack(t, r.keys.prefix, lease.SnapshotID(), liveIn.MemorySHA256)
}

// reusingOne writes the inputs of a publish that shares with in exactly
// the chunk stored under key (in's chunks with other bytes are replaced by
// random ones, seeded by seed) and returns them with that key.
func reusingOne(t *testing.T, r *Repo, in repotest.Inputs, key string, seed uint64) (repotest.Inputs, string) {
	t.Helper()
	out := chunkyInputs(t, seed)
	mem, err := os.ReadFile(in.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := os.ReadFile(out.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(mem); off += testChunkBytes {
		c := mem[off : off+testChunkBytes]
		if chunkmap.IsZero(c) || strings.TrimPrefix(r.keys.chunk(chunkmap.Sum(c)), r.keys.prefix) != key {
			copy(c, fresh[off:off+testChunkBytes])
		}
	}
	if err := os.WriteFile(out.MemoryPath, mem, 0o644); err != nil {
		t.Fatal(err)
	}
	out.MemorySHA256 = repotest.SHA256Hex(mem)
	return out, key
}

// TestRevokedPublisherWritesNoJournal: a publisher whose lease a collector
// revoked (it looked dead) learns so at its next renewal and then names
// no chunk in a journal: the publish fails with ErrLeaseEnded before it
// stores a chunk, and leaves nothing of the snapshot.
func TestRevokedPublisherWritesNoJournal(t *testing.T) {
	needServer(t)
	o := testOptions(t, server.Endpoint)
	o.ChunkBytes, o.BlockBytes, o.LeaseTTL = testChunkBytes, testChunkBytes, time.Second
	r := openWith(t, o)
	in := chunkyInputs(t, 64)
	lease := beginCapture(t, r)
	id := lease.SnapshotID()
	objs, err := r.list(bg(), r.keys.leasesOf(id))
	if err != nil || len(objs) != 1 {
		t.Fatalf("lease objects of %s: %v, %v", id, objs, err)
	}
	if revoked, err := r.revokeLease(bg(), id, objs[0]); err != nil || !revoked {
		t.Fatalf("revoke: %v, %v", revoked, err)
	}
	waitUntil(t, 10*time.Second, func() bool { return r.leaseLost(id) })
	if _, err := r.Publish(bg(), lease, in.Request("")); !errors.Is(err, repository.ErrLeaseEnded) {
		t.Fatalf("Publish under a revoked lease: %v, want ErrLeaseEnded", err)
	}
	if got := present(t, r, chunkKeysOf(t, r, in.MemoryPath)); len(got) != 0 {
		t.Errorf("the revoked publisher stored chunks %v", got)
	}
	for _, k := range artifactKeys(t, r, id) {
		if !strings.HasPrefix(k, leasesDir) {
			t.Errorf("the revoked publish left %s", k)
		}
	}
}

// leaseWriteFault fails the lease object writes it carries while on is
// set: a publisher cut off from the store for its renewals.
type leaseWriteFault struct {
	next http.RoundTripper
	on   atomic.Bool
}

func (f *leaseWriteFault) RoundTrip(req *http.Request) (*http.Response, error) {
	if f.on.Load() && req.Method == http.MethodPut && strings.Contains(req.URL.Path, "/"+leasesDir) {
		return nil, errors.New("lease write cut off by the test")
	}
	return f.next.RoundTrip(req)
}

// TestSweptLeaseObjectIsNoLicenceToReclaim: a publisher confirms its
// lease before its record, then cannot write its lease object for longer
// than twice the lease TTL (its renewals fail) and its record lands well
// within half the abandoned grace after the confirmation. A sweep on
// another node meanwhile must not take the publish for dead: the expired
// lease object it may remove is the publisher's last sign of life, and a
// publish confirmed within the grace cannot be told from a dead one
// without it. Whatever the publish returns, a record it leaves reads back
// whole.
func TestSweptLeaseObjectIsNoLicenceToReclaim(t *testing.T) {
	needServer(t)
	o := chunkyOptions(t, server.Endpoint, "")
	o.LeaseTTL, o.AbandonedGrace = time.Second, 8*time.Second
	collector := openWith(t, o)
	fault := &leaseWriteFault{next: passThrough()}
	o.Transport = fault
	pub := openWith(t, o)
	in := chunkyInputs(t, 65)
	lease := beginCapture(t, pub)
	id := lease.SnapshotID()
	// The sweep below comes once the id is older than the grace, and less
	// than half of it after the confirmation.
	waitUntil(t, 30*time.Second, func() bool { return idOlderThan(id, pub.abandonedGrace-3*time.Second) })
	pub.afterConfirmLease = func() {
		confirmed := time.Now()
		fault.on.Store(true)
		defer fault.on.Store(false)
		waitUntil(t, 30*time.Second, func() bool {
			return time.Since(confirmed) > 2*pub.leaseTTL+200*time.Millisecond && idOlderThan(id, pub.abandonedGrace)
		})
		if err := collector.Sweep(bg()); err != nil {
			t.Error(err)
		}
		if _, err := collector.CollectGarbage(bg()); err != nil {
			t.Error(err)
		}
		if time.Since(confirmed) >= pub.abandonedGrace/2 {
			t.Errorf("the record lands %v after the confirmation: the test needs less than %v", time.Since(confirmed), pub.abandonedGrace/2)
		}
	}
	rec, err := pub.Publish(bg(), lease, in.Request(""))
	if err != nil {
		if _, gerr := collector.Get(bg(), id); !errors.Is(gerr, repository.ErrNotFound) {
			t.Fatalf("the publish failed (%v) and left a record: %v", err, gerr)
		}
		t.Logf("the publish failed: %v", err)
		return
	}
	readsBack(t, collector.keys.prefix, rec.ID, in.MemorySHA256)
}
