package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/api"
	"warmstart/internal/config"
	"warmstart/internal/lab/miniotest"
	"warmstart/internal/node"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/repository/s3"
)

// Several nodes, one bucket: each test runs two daemons, each a child
// process with its own runtime directory, node cache, socket and FUSE
// mount, on one real MinIO bucket the test creates (its server and data
// go with the test).

const clusterBucket = "nodes"

// cluster is the reference snapshot and the MinIO bucket the nodes share.
type cluster struct {
	f   *fixture
	srv *miniotest.Server
	// recordOnPublish is [manifest] record_after_publish of the
	// nodes started from then on.
	recordOnPublish bool
	// trust is the [trust] table of each node by name ("" for none).
	trust map[string]string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	srv := miniotest.Start(t)
	if err := srv.MakeBucket(context.Background(), clusterBucket); err != nil {
		t.Fatal(err)
	}
	return &cluster{f: newFixture(t, fixtureOptions{}), srv: srv}
}

// s3Node is one daemon of the cluster.
type s3Node struct {
	name    string
	cfgPath string
	cfg     *config.Config
	child   *child
	client  *api.Client
}

// nodeConfig writes the configuration of node name: the bucket reached
// at endpoint (the server's, or a proxy's in front of it).
func (c *cluster) nodeConfig(t *testing.T, name, endpoint string) (string, *config.Config) {
	t.Helper()
	dir := filepath.Join(c.f.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf(`
[snapshot]
repository_backend = "s3"
[manifest]
record_after_publish = %t
[prefetch]
on_restore = true
[backend.s3]
endpoint = "http://%s"
bucket = %q
region = "us-east-1"
addressing_style = "path"
access_key_id = %q
secret_access_key = %q
cache_dir = %q
cache_max_size_gb = 1
`, c.recordOnPublish, endpoint, clusterBucket, miniotest.AccessKey, miniotest.SecretKey, filepath.Join(dir, "cache")) +
		nodeSections(dir, filepath.Join(dir, "d.sock"), c.f.dir, c.f.ref.Trace, c.trust[name])
	path := filepath.Join(dir, "warmstart.toml")
	cfg := writeAndLoadConfig(t, path, text)
	return path, cfg
}

// start runs node name's daemon as a child process, reaching the bucket at
// endpoint; extra is added to its environment. The daemon is stopped with
// SIGTERM (and must exit cleanly) when the test ends, unless stopped before.
func (c *cluster) start(t *testing.T, name, endpoint string, extra ...string) *s3Node {
	t.Helper()
	n := &s3Node{name: name}
	n.cfgPath, n.cfg = c.nodeConfig(t, name, endpoint)
	n.child = startChild(t, n.cfgPath, extra...)
	n.client = api.NewClient(n.cfg.Daemon.Socket)
	t.Cleanup(func() { n.stop(t) })
	return n
}

// stop shuts the daemon down with SIGTERM; it must leave no mount behind.
func (n *s3Node) stop(t *testing.T) {
	t.Helper()
	select {
	case <-n.child.exited:
		return
	default:
	}
	n.client.Close()
	if err := syscall.Kill(n.child.pid, syscall.SIGTERM); err != nil {
		t.Errorf("stop %s: %v", n.name, err)
	}
	<-n.child.exited
	if n.child.err != nil {
		t.Errorf("daemon %s exited with %v", n.name, n.child.err)
	}
	if mounted(t, n.cfg.Memory.FUSEMount) {
		t.Errorf("daemon %s left its mount %s", n.name, n.cfg.Memory.FUSEMount)
	}
}

// restoreChecked restores ref on n and checks the guest read the
// reference's bytes; it returns the restore's id.
func (c *cluster) restoreChecked(t *testing.T, n *s3Node, ref string) string {
	t.Helper()
	in, err := n.client.Restore(context.Background(), api.RestoreRequest{Snapshot: ref, Device: "file", Prefetch: "off"})
	if err != nil {
		t.Fatalf("restore %s on %s: %v", ref, n.name, err)
	}
	if got := in.Ready.SHA256; got != c.f.expected {
		t.Fatalf("restore %s on %s: the guest read sha256 %s, want %s", ref, n.name, got, c.f.expected)
	}
	return in.ID
}

// wantGone checks ref is not in n's catalog.
func wantGone(t *testing.T, n *s3Node, ref string) {
	t.Helper()
	_, err := n.client.Snapshot(context.Background(), ref)
	var apiErr *api.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("snapshot %s on %s: %v; want 404", ref, n.name, err)
	}
}

// A snapshot imported on A restores on B, whose node cache has never seen
// it, and the guest there reads exactly the published bytes.
func TestMultiNodePublishOnARestoreOnB(t *testing.T) {
	c := newCluster(t)
	a := c.start(t, "a", c.srv.Endpoint)
	b := c.start(t, "b", c.srv.Endpoint)
	ctx := context.Background()
	imp, err := a.client.Import(ctx, c.f.importRequest("ref"))
	if err != nil {
		t.Fatal(err)
	}
	id := c.restoreChecked(t, b, "ref")
	if info, err := b.client.Snapshot(ctx, "ref"); err != nil || info.ID != imp.ID {
		t.Fatalf("ref on B: %+v, %v; want %s", info, err, imp.ID)
	}
	if _, err := b.client.StopRestore(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// A and B publish one alias at the same moment: exactly one wins, the
// other gets the alias conflict (409), and the alias names the winner on
// both nodes.
func TestMultiNodeSameAliasAtOnce(t *testing.T) {
	c := newCluster(t)
	nodes := []*s3Node{c.start(t, "a", c.srv.Endpoint), c.start(t, "b", c.srv.Endpoint)}
	start := make(chan struct{})
	type result struct {
		imp api.ImportResponse
		err error
	}
	results := make(chan result, len(nodes))
	for _, n := range nodes {
		go func() {
			<-start
			imp, err := n.client.Import(context.Background(), c.f.importRequest("web"))
			results <- result{imp, err}
		}()
	}
	close(start)
	var winners []string
	conflicts := 0
	for range nodes {
		r := <-results
		var apiErr *api.APIError
		switch {
		case r.err == nil:
			winners = append(winners, r.imp.ID)
		case errors.As(r.err, &apiErr) && apiErr.StatusCode == http.StatusConflict:
			conflicts++
		default:
			t.Errorf("import: %v; want success or the alias conflict (409)", r.err)
		}
	}
	if len(winners) != 1 || conflicts != 1 {
		t.Fatalf("%d imports won (%v) and %d got the conflict; want one of each", len(winners), winners, conflicts)
	}
	for _, n := range nodes {
		if info, err := n.client.Snapshot(context.Background(), "web"); err != nil || info.ID != winners[0] {
			t.Errorf("web on %s: %+v, %v; want %s", n.name, info, err, winners[0])
		}
	}
}

// A deletes a snapshot while B restores it on its file device with a cold
// node cache and no prefetch: B's first device read is held until the
// delete has happened, so every byte B's guest reads comes from the bucket
// after the delete. B still reaches ready with the published bytes and
// stops cleanly; afterwards the snapshot is gone on both.
func TestMultiNodeDeleteWhileRestoring(t *testing.T) {
	c := newCluster(t)
	a := c.start(t, "a", c.srv.Endpoint)
	fifo := filepath.Join(c.f.dir, "release-b")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	b := c.start(t, "b", c.srv.Endpoint, childHoldEnv+"=0", childHoldFIFOEnv+"="+fifo)
	ctx := context.Background()
	imp, err := a.client.Import(ctx, c.f.importRequest("ref"))
	if err != nil {
		t.Fatal(err)
	}
	restored := make(chan string, 1)
	go func() {
		defer close(restored)
		in, err := b.client.Restore(ctx, api.RestoreRequest{Snapshot: imp.ID, Device: "file", Prefetch: "off"})
		if err != nil {
			t.Errorf("restore on B: %v", err)
			return
		}
		if got := in.Ready.SHA256; got != c.f.expected {
			t.Errorf("restore on B after the delete: the guest read sha256 %s, want %s", got, c.f.expected)
		}
		restored <- in.ID
	}()
	b.child.wait(t, msgHolding)
	if _, err := a.client.DeleteSnapshot(ctx, imp.ID); err != nil {
		t.Fatal(err)
	}
	wantGone(t, a, imp.ID)
	fetchedBefore := value(metricsOf(t, b.client), "warmstart_chunk_cache_fetched_bytes_total", nil)
	release(t, fifo)
	id, ok := <-restored
	if !ok {
		t.FailNow()
	}
	b.child.wait(t, msgReleased)
	if after := value(metricsOf(t, b.client), "warmstart_chunk_cache_fetched_bytes_total", nil); after <= fetchedBefore {
		t.Errorf("B fetched %v bytes from the bucket after the delete; want its guest's reads served from there", after-fetchedBefore)
	}
	stop, err := b.client.StopRestore(ctx, id)
	if err != nil {
		t.Fatalf("stop the restore on B: %v", err)
	}
	if stop.Exit != nil {
		t.Errorf("B's VM had exited before the stop: %+v", stop.Exit)
	}
	wantGone(t, a, imp.ID)
	wantGone(t, b, imp.ID)
	wantGone(t, b, "ref")
}

// release lets a child's held reads go on (see childHoldFIFOEnv).
func release(t *testing.T, fifo string) {
	t.Helper()
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0) // the child is waiting on the other end
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// gcGrace is the chunk grace of the garbage collection test's nodes: long
// enough for a publish's uploads, short enough to wait out.
const gcGrace = 2 * time.Second

// A deleted a snapshot whose grace has passed and collects garbage, again
// and again, while B (slowed by 20 ms on every response) publishes a
// snapshot that shares all but one of its chunks. Nothing of B's is lost:
// its snapshot reads back whole, byte for byte, through a third, fresh
// node cache, after one more collection; the deleted snapshot's own chunk
// is collected.
func TestMultiNodeGCWhilePublishing(t *testing.T) {
	c := newCluster(t)
	grace := childChunkGraceEnv + "=" + gcGrace.String()
	a := c.start(t, "a", c.srv.Endpoint, grace)
	proxy, err := miniotest.NewProxy(c.srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	if err := proxy.Latency(20); err != nil {
		t.Fatal(err)
	}
	b := c.start(t, "b", proxy.Addr, grace)
	ctx := context.Background()
	old, err := a.client.Import(ctx, c.f.importRequest("old"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.client.DeleteSnapshot(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	// What is waited for here is the grace itself, not another goroutine:
	// the deleted snapshot's chunks and tombstone must be past it (the
	// store's clock has a resolution of a second).
	time.Sleep(gcGrace + time.Second)

	gc := c.openNodeRepository(t, a.cfg, false)
	req := c.f.importRequest("new")
	req.Memory = writeOneChunkChanged(t, c.f.ref.Memory, filepath.Join(c.f.dir, "new-memory.bin"))
	published := make(chan api.ImportResponse, 1)
	go func() {
		defer close(published)
		imp, err := b.client.Import(ctx, req)
		if err != nil {
			t.Errorf("import on B: %v", err)
			return
		}
		published <- imp
	}()
	var removed, runs int
	collect := func() {
		st := collectGarbage(t, gc)
		removed += st.Removed
		runs++
	}
	var imp api.ImportResponse
	for done := false; !done; {
		collect()
		select {
		case got, ok := <-published:
			if !ok {
				t.FailNow()
			}
			imp, done = got, true
		default:
		}
	}
	collect()
	t.Logf("%d collections, %d chunks removed", runs, removed)
	if removed == 0 {
		t.Error("no collection removed the deleted snapshot's own chunk")
	}
	third := c.openNodeRepository(t, b.cfg, true)
	res, err := third.Resolve(ctx, imp.ID)
	if err != nil {
		t.Fatalf("resolve B's snapshot on a fresh cache: %v", err)
	}
	if got, want := repotest.ResolvedMemorySHA256(t, res), repotest.FileSHA256(t, req.Memory); got != want {
		t.Fatalf("B's snapshot read through a fresh cache: sha256 %s, want %s", got, want)
	}
}

// openNodeRepository opens the bucket as a node with cfg does, with the
// test's chunk grace; read-only ones get a fresh node cache of their own.
func (c *cluster) openNodeRepository(t *testing.T, cfg *config.Config, readOnly bool) *s3.Repo {
	t.Helper()
	o := node.S3Options(cfg.Backend.S3)
	o.ChunkGrace, o.ReadOnly = gcGrace, readOnly
	if readOnly {
		o.CacheDir = t.TempDir()
	}
	r, err := s3.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// collectGarbage is `warmstart snapshot gc` on r's node.
func collectGarbage(t *testing.T, r *s3.Repo) s3.GCStats {
	t.Helper()
	if err := r.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := r.CollectGarbage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// writeOneChunkChanged copies memory to path with one byte of its first
// non-zero page changed, so the copy shares every chunk but one.
func writeOneChunkChanged(t *testing.T, memory, path string) string {
	t.Helper()
	data, err := os.ReadFile(memory)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range data {
		if v != 0 {
			data[i] ^= 0xff
			break
		}
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A records a snapshot's manifest (held mid-recording) when B starts: B's
// resume of interrupted recordings sees A's lease through the bucket and
// leaves the recording to A instead of starting a second one.
func TestMultiNodeResumeLeavesAnotherNodesRecording(t *testing.T) {
	c := newCluster(t)
	c.recordOnPublish = true
	a := c.start(t, "a", c.srv.Endpoint, childStallRecordingEnv+"=1")
	imp, err := a.client.Import(context.Background(), c.f.importRequest("ref"))
	if err != nil {
		t.Fatal(err)
	}
	if !imp.Recording {
		t.Fatalf("import = %+v; want a background recording", imp)
	}
	a.child.wait(t, msgRecordingStarted)
	defer func() { // its recording never ends: only a kill stops it
		syscall.Kill(a.child.pid, syscall.SIGKILL)
		<-a.child.exited
	}()

	b := c.start(t, "b", c.srv.Endpoint) // resumes before it is ready
	for _, m := range b.child.messages() {
		if m["msg"] == "resuming interrupted manifest recording" {
			t.Fatalf("B started a second recording of %s while A records it: %v", imp.ID, m)
		}
	}
	b.child.wait(t, "manifest recording in progress elsewhere")
}

// A is killed in the middle of a recording; B, started at once, finds A's
// lease still live (an S3 lease outlives its crashed holder until it
// expires) and leaves the recording, then looks again, claims it once
// A's lease has expired, and attaches the manifest.
func TestMultiNodeResumeAfterCrashedHolderExpires(t *testing.T) {
	c := newCluster(t)
	c.recordOnPublish = true
	ttl := childLeaseTTLEnv + "=10s" // long enough for B to start while it is live
	a := c.start(t, "a", c.srv.Endpoint, childStallRecordingEnv+"=1", ttl)
	imp, err := a.client.Import(context.Background(), c.f.importRequest("ref"))
	if err != nil {
		t.Fatal(err)
	}
	a.child.wait(t, msgRecordingStarted)
	if err := syscall.Kill(a.child.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.child.exited

	b := c.start(t, "b", c.srv.Endpoint, ttl)
	// A daemon that never looks again would never log it: kill it after a
	// bound so the wait below fails instead of hanging.
	bound := time.AfterFunc(2*time.Minute, func() { syscall.Kill(b.child.pid, syscall.SIGKILL) })
	defer bound.Stop()
	b.child.wait(t, "manifest recording in progress elsewhere")
	b.child.wait(t, "resuming interrupted manifest recording")
	b.child.wait(t, "startup manifest attached")
	info, err := b.client.Snapshot(context.Background(), imp.ID)
	if err != nil || info.Manifest == nil {
		t.Fatalf("after the resume on B: %+v, %v; want the manifest attached", info, err)
	}
}

// A read-only verb (restore, verify) opening the node cache directory a
// running daemon has open removes none of the daemon's files: not a block
// it is writing, not the blocks it serves from.
func TestReadOnlyVerbBesideDaemonKeepsItsFiles(t *testing.T) {
	c := newCluster(t)
	a := c.start(t, "a", c.srv.Endpoint)
	ctx := context.Background()
	imp, err := a.client.Import(ctx, c.f.importRequest("ref"))
	if err != nil {
		t.Fatal(err)
	}
	id := c.restoreChecked(t, a, "ref") // fills A's node cache
	if _, err := a.client.StopRestore(ctx, id); err != nil {
		t.Fatal(err)
	}
	chunks := filepath.Join(a.cfg.Backend.S3.CacheDir, "chunks")
	objects, err := os.ReadDir(chunks)
	if err != nil || len(objects) == 0 {
		t.Fatalf("A's node cache holds no blocks: %v", err)
	}
	// A block the daemon is writing, before its rename.
	inflight := filepath.Join(chunks, objects[0].Name(), ".tmp-inflight")
	if err := os.WriteFile(inflight, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := filesUnder(t, chunks)

	o := node.S3Options(a.cfg.Backend.S3)
	o.ReadOnly, o.CacheMaxBytes = true, 4096 // it evicts whatever it found
	verb, err := s3.Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	res, err := verb.Resolve(ctx, imp.ID)
	if err != nil {
		verb.Close()
		t.Fatal(err)
	}
	got := repotest.ResolvedMemorySHA256(t, res)
	verb.Close()
	if want := repotest.FileSHA256(t, c.f.ref.Memory); got != want {
		t.Fatalf("memory read by the verb: sha256 %s, want %s", got, want)
	}
	after := filesUnder(t, chunks)
	for _, f := range before {
		if !slices.Contains(after, f) {
			t.Errorf("the read-only verb removed the daemon's %s", f)
		}
	}
}

// filesUnder lists the files below dir.
func filesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
