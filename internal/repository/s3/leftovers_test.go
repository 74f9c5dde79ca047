package s3

import (
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/chunkmap"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

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
// object: its live lease protects them. It then completes.
func TestAbandonedPublishReclaimedLivePublishKept(t *testing.T) {
	needServer(t)
	o := testOptions(t, server.Endpoint)
	o.ChunkBytes, o.BlockBytes = testChunkBytes, testChunkBytes
	o.LeaseTTL, o.AbandonedGrace, o.ChunkGrace = time.Second, 3*time.Second, time.Second
	r := openWith(t, o)
	desc, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}

	killedIn := chunkyInputs(t, 61)
	c := repotest.StartChild(t, "publish-midway", string(desc), repotest.PublishEnv(killedIn, ""), nil)
	killed := c.Ready(t)
	if err := c.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, sig := c.Wait(t); sig != syscall.SIGKILL {
		t.Fatalf("publisher ended by %v, not SIGKILL: %s", sig, c.Stderr())
	}
	died := time.Now()
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

	// The live publish begins once the killed one's chunks are older
	// than the clock skew a publish's start allows for.
	waitUntil(t, 30*time.Second, func() bool { return time.Since(died) > r.leaseTTL+time.Second })
	liveIn := chunkyInputs(t, 62)
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
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
	if err := r.Sweep(bg()); err != nil {
		t.Fatal(err)
	}
	st, err := r.CollectGarbage(bg())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("collection: %+v", st)
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
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
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
	_, err = r.Publish(bg(), lease, in.Request("revoked"))
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
