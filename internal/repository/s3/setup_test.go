package s3

import (
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/lab/miniotest"
	"warmstart/internal/layers"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
	"warmstart/internal/restore/restoretest"
)

// The set-ups many tests of this package share, each in one place so a
// test reads as the behaviour it checks.

// chunkyOptions are testOptions for endpoint with test-sized chunks and
// blocks (many of each in a small memory), under prefix when it is not
// empty (another node's), else under a fresh one.
func chunkyOptions(t testing.TB, endpoint, prefix string) Options {
	o := testOptions(t, endpoint)
	if prefix != "" {
		o.Prefix = prefix
	}
	o.ChunkBytes, o.BlockBytes = testChunkBytes, testChunkBytes
	return o
}

// ownServer starts a MinIO of the test's own, one it may stop, freeze or
// kill without disturbing other tests, with the test bucket made.
func ownServer(t testing.TB) *miniotest.Server {
	t.Helper()
	own := miniotest.Start(t)
	if err := own.MakeBucket(bg(), testBucket); err != nil {
		t.Fatal(err)
	}
	return own
}

// ownChunkyRepo opens a repository with chunkyOptions on a MinIO of the
// test's own (ownServer), and returns both.
func ownChunkyRepo(t testing.TB) (*miniotest.Server, *Repo) {
	t.Helper()
	own := ownServer(t)
	return own, openWith(t, chunkyOptions(t, own.Endpoint, ""))
}

// beginCapture takes a capture lease on r, ended when the test ends.
func beginCapture(t testing.TB, r *Repo) repository.Lease {
	t.Helper()
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.End() })
	return lease
}

// passThrough is the transport a fault wraps: a clone of the default one.
func passThrough() http.RoundTripper { return http.DefaultTransport.(*http.Transport).Clone() }

// aim points a fault's suffix at key, one of r's object keys: the fault
// takes the requests whose path ends with key below r's prefix.
func aim(suffix *atomic.Pointer[string], r *Repo, key string) {
	s := strings.TrimPrefix(key, r.keys.prefix)
	suffix.Store(&s)
}

// restoreOnReopenedCache reopens a node on o's cache directory (where
// restoredOnce left snap's blocks, which the test may have damaged),
// restores snap on it without prefetch and stops it; it returns the node
// and the GETs the restore made.
func (w *world) restoreOnReopenedCache(t *testing.T, snap snapshot, o Options) (*Repo, uint64) {
	t.Helper()
	node := openWith(t, o)
	before := node.RequestStats()
	inst := w.restoreOK(t, node, snap, restore.ModeOff)
	if err := inst.Stop(bg()); err != nil {
		t.Fatal(err)
	}
	return node, node.RequestStats().Sub(before).Gets
}

// prefetchAsANode has the world's prefetching restores attach the file
// device on a mount of their own, as a node's: one that faults one page at
// a time, so a fault reads no neighbour outside what prefetch fetched.
func (w *world) prefetchAsANode(t *testing.T) {
	t.Helper()
	prefetching, err := fusedev.Mount(filepath.Join(w.dir, "mnt-prefetching"),
		fusedev.Options{ReadAheadBytes: config.Default().Memory.PrefetchReadaroundBytes()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prefetching.Close() })
	w.restorer.Devices = restoretest.Devices(w.srv, prefetching)
}

// patchBlocksKeepingCRC patches every page of every cached block file
// matching pattern with repotest.PatchKeepingCRC (other bytes, the same
// CRC-32C, so the cache's own check passes), as a writer of the node's
// cache directory could; what names the files in the error when none match.
func patchBlocksKeepingCRC(t *testing.T, pattern, what string) {
	t.Helper()
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		t.Fatalf("%s %v (%v)", what, files, err)
	}
	for _, f := range files {
		_, _, length, _, ok := blockFileName(filepath.Base(f))
		if !ok {
			t.Fatalf("unexpected cache file %s", f)
		}
		for off := int64(0); off+4096 <= length; off += 4096 {
			repotest.PatchKeepingCRC(t, f, off)
		}
	}
}

// retiringChain is what the tests of a flatten that retires a layer start
// from: two nodes on one prefix, a base and its child mid published on A,
// the name of mid's own layer (the one a flatten of mid retires), and a
// layer built over mid for a grandchild with the memory it gives.
type retiringChain struct {
	nodeA, nodeB *Repo
	base, mid    repotest.Lineage
	retired      string
	built        *layers.Built
	childMem     []byte
}

func newRetiringChain(t *testing.T) retiringChain {
	t.Helper()
	var c retiringChain
	c.nodeA, c.nodeB, c.base = twoNodesOverABase(t)
	c.mid = repotest.PublishChild(t, c.nodeA, c.base, repotest.Change{Pages: []int64{1, 5}}, "")
	c.retired = c.mid.Record.MemoryLayers[len(c.mid.Record.MemoryLayers)-1].Name
	c.built, c.childMem = repotest.BuildLayer(t, c.mid.Memory, repotest.Change{Pages: []int64{2, 5}})
	return c
}

// twoNodesOverABase opens two nodes on one fresh prefix, each with a
// cache of its own, and publishes a base of eight chunks on the first.
func twoNodesOverABase(t *testing.T) (nodeA, nodeB *Repo, base repotest.Lineage) {
	t.Helper()
	nodeA = chunkyRepo(t, "")
	nodeB = chunkyRepo(t, nodeA.keys.prefix)
	return nodeA, nodeB, repotest.PublishBase(t, nodeA, 8*testChunkBytes, "")
}

// chunkyPublisher opens a node with chunkyOptions on a fresh prefix and
// publishes chunkyInputs(seed) on it, for the tests of what other nodes
// on that prefix read of the snapshot.
func chunkyPublisher(t *testing.T, seed uint64) (*Repo, repository.Record) {
	t.Helper()
	pub := chunkyRepo(t, "")
	rec, _ := repotest.PublishInputs(t, pub, chunkyInputs(t, seed), "")
	return pub, rec
}
