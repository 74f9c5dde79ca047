package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/lab/miniotest"
	"warmstart/internal/node"
	"warmstart/internal/pause"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/s3"

	"github.com/minio/minio-go/v7"
	"golang.org/x/sys/unix"
)

// failedPauseLeavesSandbox checks what a pause that failed at its publish
// must leave: the sandbox listed and running, no child under alias.
func failedPauseLeavesSandbox(t *testing.T, r *running, alias string) {
	t.Helper()
	ctx := context.Background()
	info, err := r.client.Restores(ctx)
	if err != nil || len(info) != 1 || info[0].Exit != nil {
		t.Fatalf("restores after the failed pause: %+v, %v; want the sandbox running", info, err)
	}
	if s, err := r.client.Snapshot(ctx, alias); err == nil {
		t.Fatalf("a failed pause left a child: %+v", s)
	}
}

// stagedChildID is the id of the child a pause stages in runtimeDir: its
// staging directory is pause-ID-*.
func stagedChildID(runtimeDir string) (string, error) {
	dirs, err := filepath.Glob(filepath.Join(runtimeDir, pause.StagingPrefix+"*"))
	if err != nil || len(dirs) != 1 {
		return "", errors.Join(err, errors.New("not one staging directory"))
	}
	name := strings.TrimPrefix(filepath.Base(dirs[0]), pause.StagingPrefix)
	return name[:strings.LastIndex(name, "-")], nil
}

// fillUp writes path until its file system has no space left.
func fillUp(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	block := make([]byte, 1<<20)
	for i := range block {
		block[i] = byte(i) | 1
	}
	for {
		if _, err := f.Write(block); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return err
		}
	}
}

// storeFault breaks a POSIX store mounted at store (a tmpfs) and mends
// it; msg is what the failed pause's error must say.
type storeFault struct {
	name      string
	then      string
	brk, mend func(store string) error
	msg       string
	// status is the failed pause's HTTP status; 0 leaves it unchecked.
	status int
}

// readOnly covers store with a read-only bind mount of itself: what the
// daemon has open stays writable, every path it opens anew is not.
func readOnly(store string) error {
	if err := unix.Mount(store, store, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return unix.Mount("", store, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
}

func unmount(store string) error { return unix.Unmount(store, 0) }

// TestPauseWhileTheStoreIsUnwritable: the POSIX store (a small tmpfs)
// fills up, or turns read-only, just as a pause publishes its child. The
// pause fails saying why (507: no space, or a read-only file system), the
// sandbox runs again (also with then=stop), nothing of the child is
// visible and, once the store is mended, nothing
// it left stays (the repository's sweep at open reclaims it). A later
// pause publishes a child holding every page written since the restore.
func TestPauseWhileTheStoreIsUnwritable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	filler := func(store string) string { return filepath.Join(store, "filler") }
	full := storeFault{brk: func(s string) error { return fillUp(filler(s)) },
		mend: func(s string) error { return os.Remove(filler(s)) }, msg: "no space left",
		status: http.StatusInsufficientStorage}
	ro := storeFault{name: "read-only", then: api.ThenResume, brk: readOnly, mend: unmount,
		msg: "read-only file system", status: http.StatusInsufficientStorage}
	fullResume, fullStop := full, full
	fullResume.name, fullResume.then = "full-resume", api.ThenResume
	fullStop.name, fullStop.then = "full-stop", api.ThenStop
	for _, c := range []storeFault{fullResume, fullStop, ro} {
		t.Run(c.name, func(t *testing.T) { pauseWithStoreFault(t, c) })
	}
}

func pauseWithStoreFault(t *testing.T, c storeFault) {
	f := newFixture(t, fixtureOptions{})
	store := f.cfg.Backend.PosixFS.SnapshotStore
	if err := os.MkdirAll(store, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", store, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount a small tmpfs store: %v", err)
	}
	failedID := breakOnPublish(t, f, "break the store", func() error { return c.brk(store) })
	r, imp, in := pausableRestore(t, f, nil)
	ctx := context.Background()
	_, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: c.then})
	if err == nil {
		t.Fatal("a pause into a broken store published")
	}
	if !strings.Contains(err.Error(), c.msg) {
		t.Errorf("the failed pause's error does not say %q: %v", c.msg, err)
	}
	if ae := (*api.APIError)(nil); c.status != 0 && (!errors.As(err, &ae) || ae.StatusCode != c.status) {
		t.Errorf("the failed pause answered %v; want HTTP %d", err, c.status)
	}
	failedPauseLeavesSandbox(t, r, "kid")
	if err := c.mend(store); err != nil {
		t.Fatal(err)
	}
	// What the failed publish left is reclaimed at the latest by the
	// sweep a repository runs at open.
	if _, err := posixfs.Open(store, posixfs.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(store, "snapshots", *failedID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed child's directory %s stays after a sweep: %v", *failedID, err)
	}
	pauseAgainPublishes(t, r, f, in.ID, imp.ID)
}

// s3Store is a MinIO server with a bucket of its own; open opens the
// bucket as a node with a fresh cache does.
type s3Store struct {
	srv    *miniotest.Server
	bucket string
}

func newS3Store(t *testing.T, bucket string) *s3Store {
	t.Helper()
	srv := miniotest.Start(t)
	if err := srv.MakeBucket(context.Background(), bucket); err != nil {
		t.Fatal(err)
	}
	return &s3Store{srv: srv, bucket: bucket}
}

func (s *s3Store) open(t *testing.T) *s3.Repo {
	t.Helper()
	repo, err := s3.Open(context.Background(), s3.Options{
		Endpoint: "http://" + s.srv.Endpoint, Bucket: s.bucket, Region: "us-east-1", AddressingStyle: "path",
		AccessKeyID: miniotest.AccessKey, SecretAccessKey: miniotest.SecretKey,
		CacheDir: t.TempDir(), CacheMaxBytes: 256 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { repo.Close() })
	return repo
}

// pauseAgainPublishes: once the store works again, a pause of restore id
// publishes "kid", a child of parent that reads the pages the guest
// stamped, and both verify.
func pauseAgainPublishes(t *testing.T, r *running, f *fixture, id, parent string) {
	t.Helper()
	res, err := r.client.Pause(context.Background(), id, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
	if err != nil {
		t.Fatalf("a pause once the store works again: %v", err)
	}
	if res.Parent != parent {
		t.Fatalf("pause: %+v, want a child of %s", res, parent)
	}
	childReadsStamped(t, r, f, "kid")
	verifyOK(t, r.client, parent, "kid")
}

// verifyOK verifies each snapshot on c's daemon (its node cache too) and
// wants no problem.
func verifyOK(t *testing.T, c *api.Client, ids ...string) {
	t.Helper()
	for _, id := range ids {
		rep, err := c.VerifySnapshot(context.Background(), id, api.VerifyRequest{})
		if err != nil || !rep.OK {
			t.Fatalf("verify %s: %v, problems %+v", id, err, rep.Problems)
		}
	}
}

// TestVerifyOfAnS3Child: snapshot verify of a pause's child on an S3
// store checks what the node cache holds of every layer of its chain
// against the layer's digest table, as it does for a plain snapshot's
// memory, and finds no problem.
func TestVerifyOfAnS3Child(t *testing.T) {
	st := newS3Store(t, "verifykid")
	f := newFixture(t, fixtureOptions{})
	r, imp, in := pausableRestore(t, f, func(o *daemon.Options) { o.Repository = st.open(t) })
	ctx := context.Background()
	if _, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop}); err != nil {
		t.Fatal(err)
	}
	childReadsStamped(t, r, f, "kid") // the child's layers are now cached
	verifyOK(t, r.client, imp.ID, "kid")
	rep, err := r.client.VerifySnapshot(ctx, "kid", api.VerifyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Cache == nil || rep.Cache.Blocks == 0 {
		t.Fatalf("verify of the child checked no cached block: %+v", rep.Cache)
	}
}

// wantUnreachable wants err to be the daemon's answer for a store that
// does not answer: 503 with Retry-After, saying the store is unreachable.
func wantUnreachable(t *testing.T, err error) {
	t.Helper()
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || ae.RetryAfter <= 0 ||
		!strings.Contains(ae.Message, repository.ErrUnreachable.Error()) {
		t.Errorf("answer %v (%#v); want 503 with Retry-After saying %q", err, ae, repository.ErrUnreachable)
	}
}

// TestPauseWhileS3IsDown: the MinIO server of an S3 store stops just as a
// pause publishes its child. The pause fails with 503 (Retry-After), as
// do an import and a restore meanwhile, the sandbox
// runs again, and once the server is back nothing of the child is visible
// (also to a node with a fresh cache); a later pause publishes a child
// holding every page written since the restore.
func TestPauseWhileS3IsDown(t *testing.T) {
	st := newS3Store(t, "pausedown")
	srv := st.srv
	ctx := context.Background()
	f := newFixture(t, fixtureOptions{})
	failedID := breakOnPublish(t, f, "stop minio", srv.Stop)
	r, imp, in := pausableRestore(t, f, func(o *daemon.Options) { o.Repository = st.open(t) })
	t0 := time.Now()
	_, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid"})
	if err == nil {
		t.Fatal("a pause with the store down published")
	}
	t.Logf("the failed pause answered after %v: %v", time.Since(t0), err)
	wantUnreachable(t, err)
	_, err = r.client.Import(ctx, f.importRequest("other"))
	wantUnreachable(t, err)
	_, err = r.client.Restore(ctx, api.RestoreRequest{Snapshot: imp.ID})
	wantUnreachable(t, err)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	failedPauseLeavesSandbox(t, r, "kid")
	fresh := st.open(t)
	if _, err := fresh.Resolve(ctx, *failedID); err == nil {
		t.Fatalf("the failed child %s resolves on a fresh node", *failedID)
	}
	if id, err := fresh.ResolveAlias(ctx, "kid"); err == nil {
		t.Fatalf("the failed child's alias names %s on a fresh node", id)
	}
	pauseAgainPublishes(t, r, f, in.ID, imp.ID)
}

// bucketKeys lists every key of the cluster's bucket.
func bucketKeys(t *testing.T, c *cluster) []string {
	t.Helper()
	mc, err := miniotest.Client(c.srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for o := range mc.ListObjects(context.Background(), clusterBucket, minio.ListObjectsOptions{Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		out = append(out, o.Key)
	}
	return out
}

// childArtifact is the id of a snapshot other than parent that has an
// artifact in keys, "" when none has.
func childArtifact(keys []string, parent string) string {
	for _, k := range keys {
		rest, ok := strings.CutPrefix(k, "artifacts/")
		if id, _, _ := strings.Cut(rest, "/"); ok && id != parent {
			return id
		}
	}
	return ""
}

// TestDaemonKilledMidPausePublishOnS3: a daemon on an S3 store (slowed
// by 30 ms a response) is SIGKILLed once the pause's first artifact is in
// the bucket, and started again on the same runtime directory and store.
// The child never becomes visible, the dead daemon's staging is swept,
// the parent verifies, and once the dead publisher's lease has expired a
// garbage collection leaves no key of the child and no chunk the bucket
// did not hold before the pause (the child's dependent marker at the
// parent stays, stale, counted as no dependent, until the parent's
// delete).
func TestDaemonKilledMidPausePublishOnS3(t *testing.T) {
	c := newCluster(t)
	proxy, err := miniotest.NewProxy(c.srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	if err := proxy.Latency(30); err != nil {
		t.Fatal(err)
	}
	env := []string{childChunkGraceEnv + "=" + gcGrace.String(), childLeaseTTLEnv + "=2s"}
	a := c.start(t, "a", proxy.Addr, env...)
	ctx := context.Background()
	imp, err := a.client.Import(ctx, c.f.importRequest("base"))
	if err != nil {
		t.Fatal(err)
	}
	in, err := a.client.Restore(ctx, api.RestoreRequest{Snapshot: imp.ID, Pausable: true})
	if err != nil {
		t.Fatal(err)
	}
	var chunksBefore []string
	for _, k := range bucketKeys(t, c) {
		if strings.HasPrefix(k, "chunks/") {
			chunksBefore = append(chunksBefore, k)
		}
	}
	go a.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid"}) // its answer is lost with the daemon
	var child string
	deadline := time.Now().Add(time.Minute)
	for child == "" {
		if time.Now().After(deadline) {
			t.Fatal("no artifact of the child reached the bucket within a minute")
		}
		child = childArtifact(bucketKeys(t, c), imp.ID)
	}
	if err := syscall.Kill(a.child.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.child.exited
	a = c.start(t, "a", c.srv.Endpoint, env...)
	if left, _ := filepath.Glob(filepath.Join(a.cfg.Runtime.Dir, pause.StagingPrefix+"*")); len(left) != 0 {
		t.Errorf("the dead daemon's staging is left: %v", left)
	}
	if s, err := a.client.Snapshot(ctx, child); err == nil {
		t.Fatalf("the child of the killed pause is visible: %+v", s)
	}
	if s, err := a.client.Snapshot(ctx, "kid"); err == nil {
		t.Fatalf("the killed pause's alias names %+v", s)
	}
	verifyOK(t, a.client, imp.ID)
	// A collecting node with the dead daemon's lease TTL, and a grace for
	// abandoned publishes this test can wait out.
	o := node.S3Options(a.cfg.Backend.S3)
	o.ChunkGrace, o.LeaseTTL, o.AbandonedGrace = gcGrace, 2*time.Second, 2*time.Second
	gc, err := s3.Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gc.Close() })
	deadline = time.Now().Add(time.Minute)
	for {
		collectGarbage(t, gc)
		var left []string
		for _, k := range bucketKeys(t, c) {
			// The child's marker at its parent stays, stale, until the
			// parent's delete removes it (checked below).
			marker := strings.HasPrefix(k, "catalog/dependents/")
			if (strings.Contains(k, child) && !marker) || (strings.HasPrefix(k, "chunks/") && !slices.Contains(chunksBefore, k)) {
				left = append(left, k)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the kill, garbage collection leaves %v", left)
		}
	}
	verifyOK(t, a.client, imp.ID)
	if live, inProgress, err := gc.Dependents(ctx, imp.ID); err != nil || len(live)+len(inProgress) != 0 {
		t.Fatalf("the parent's dependents after the collection: %v, %v (%v)", live, inProgress, err)
	}
}
