package s3

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/minio/minio-go/v7"

	"warmstart/internal/lab/miniotest"
	"warmstart/internal/reexec"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/vmm/replay"
)

// server is the MinIO every test in the package uses, each under its own
// prefix; nil when MinIO is not installed (tests then skip).
var server *miniotest.Server

const testBucket = "warmstart-test"

func TestMain(m *testing.M) {
	reexec.Roles{
		repotest.ChildExecRole: func() int { return childMain(repotest.ChildRole()) },
		replay.RoleReplayVMM:   replay.ChildMain,
	}.Dispatch()
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "warmstart-s3-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	srv, err := miniotest.Launch(dir)
	switch {
	case errors.Is(err, miniotest.ErrNotInstalled):
		fmt.Fprintln(os.Stderr, "S3 repository tests skipped:", err)
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		return 1
	default:
		defer srv.Stop()
		if err := srv.MakeBucket(context.Background(), testBucket); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		server = srv
	}
	return m.Run()
}

func needServer(t testing.TB) {
	t.Helper()
	if server == nil {
		miniotest.Require(t)
		t.Fatal("MinIO is installed but was not started")
	}
}

func bg() context.Context { return context.Background() }

// uniquePrefix keeps each test's objects apart in the shared bucket.
func uniquePrefix(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	return "t/" + name + "-" + hex.EncodeToString(b[:])
}

// testOptions are Options for a fresh prefix of the test bucket reached at
// endpoint (the server's, or a proxy's).
func testOptions(t testing.TB, endpoint string) Options {
	return Options{
		Endpoint:        "http://" + endpoint,
		Bucket:          testBucket,
		Region:          "us-east-1",
		Prefix:          uniquePrefix(t),
		AddressingStyle: "path",
		AccessKeyID:     miniotest.AccessKey,
		SecretAccessKey: miniotest.SecretKey,
		CacheDir:        t.TempDir(),
		CacheMaxBytes:   256 << 20,
	}
}

func openWith(t testing.TB, o Options) *Repo {
	t.Helper()
	r, err := Open(bg(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func openRepo(t testing.TB) *Repo {
	t.Helper()
	needServer(t)
	return openWith(t, testOptions(t, server.Endpoint))
}

// waitHoldoffOver waits until no block of repo's cache is in its failure
// holdoff (chunkcache.DefaultFailureHoldoff): blocks whose fetch just
// failed fail reads at once until then.
func waitHoldoffOver(t testing.TB, repo *Repo) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for repo.Cache().Stats().FailedBlocks > 0 {
		if time.Now().After(deadline) {
			t.Fatal("failed blocks stay held off")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestBehaviour(t *testing.T) {
	needServer(t)
	t.Parallel()
	repotest.Run(t, func(t *testing.T) repository.Repository { return openRepo(t) })
}

func TestLayersContract(t *testing.T) {
	needServer(t)
	t.Parallel()
	repotest.RunLayers(t, func(t *testing.T) repository.Repository { return openRepo(t) })
}

func TestSigning(t *testing.T) {
	needServer(t)
	t.Parallel()
	repotest.RunSigning(t, func(t *testing.T, key ed25519.PrivateKey) repository.Repository {
		o := testOptions(t, server.Endpoint)
		o.SigningKey = key
		return openWith(t, o)
	})
}

// keysUnder lists the object keys under r's prefix, relative to it.
func keysUnder(t *testing.T, r *Repo) []string {
	t.Helper()
	objs, err := r.list(bg(), r.keys.prefix)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range objs {
		out = append(out, strings.TrimPrefix(o.Key, r.keys.prefix))
	}
	sort.Strings(out)
	return out
}

func TestObjectLayout(t *testing.T) {
	r := openRepo(t)
	rec, lease := repotest.Publish(t, r, "web")
	if _, err := r.AttachManifest(bg(), lease, []byte("manifest"), nil); err != nil {
		t.Fatal(err)
	}
	lease.End() // its lease object goes with it
	// One 64 KiB chunk of random bytes; the stand-in manifest is no
	// manifest, so no startup pack is built for it.
	want := []string{
		"artifacts/" + rec.ID + "/memory.chunks",
		"artifacts/" + rec.ID + "/memory.digests",
		"artifacts/" + rec.ID + "/memory.sha256-digests",
		"artifacts/" + rec.ID + "/startup-manifest.bin",
		"artifacts/" + rec.ID + "/vm_state.bin",
		"catalog/aliases/web.json",
		"catalog/records/" + rec.ID + ".json",
		"chunks/",
	}
	got := keysUnder(t, r)
	chunks := 0
	for i, k := range got {
		if strings.HasPrefix(k, chunksDir) {
			got[i] = chunksDir
			chunks++
		}
	}
	if chunks != 1 || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("objects:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if err := r.Delete(bg(), rec.ID); err != nil {
		t.Fatal(err)
	}
	// Chunks may be shared: garbage collection, not delete, removes them,
	// after the tombstone's grace. The alias's binding stays, released
	// (TestReleasedBindingIsFreeAndUnlisted).
	if got := keysUnder(t, r); len(got) != 3 || got[0] != "catalog/aliases/web.json" || !strings.HasPrefix(got[1], chunksDir) ||
		got[2] != tombstonesDir+rec.ID+".chunks" {
		t.Fatalf("objects left after delete: %v", got)
	}
}

// TestMultipartPublish publishes a memory file larger than PartBytes (many
// chunks, uploaded in parallel) and reads it back through the chunk cache.
func TestMultipartPublish(t *testing.T) {
	r := openRepo(t)
	in := repotest.NewInputs(t, PartBytes+PartBytes/2+4096)
	lease := beginCapture(t, r)
	rec, err := r.Publish(bg(), lease, in.Request(""))
	if err != nil {
		t.Fatal(err)
	}
	if rec.MemorySHA256 != in.MemorySHA256 || rec.MemorySize != in.MemorySize {
		t.Fatalf("record memory %d/%s, want %d/%s", rec.MemorySize, rec.MemorySHA256, in.MemorySize, in.MemorySHA256)
	}
	res, err := r.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := repotest.ResolvedMemorySHA256(t, res); got != in.MemorySHA256 {
		t.Fatalf("memory read back as %s, want %s", got, in.MemorySHA256)
	}
}

// TestFailedPublishLeavesNothing makes the record write fail (the alias
// binding succeeds, then the context is cancelled) and checks that the
// artifacts are removed and the alias released, so it binds again at once.
func TestFailedPublishLeavesNothing(t *testing.T) {
	r := openRepo(t)
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	lease := beginCapture(t, r)
	ctx, cancel := context.WithCancel(bg())
	r.beforeRecord = cancel
	_, err := r.Publish(ctx, lease, in.Request("fails"))
	r.beforeRecord = nil
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("publish: %v, want context.Canceled", err)
	}
	lease.End() // its lease object goes with it
	for _, k := range snapshotKeys(t, r) {
		if !strings.HasPrefix(k, "catalog/aliases/") {
			t.Errorf("failed publish left %s", k)
		}
	}
	if _, err := r.ResolveAlias(bg(), "fails"); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("alias of failed publish: %v", err)
	}
	rec, _ := repotest.Publish(t, r, "fails")
	if id, err := r.ResolveAlias(bg(), "fails"); err != nil || id != rec.ID {
		t.Fatalf("alias after failed publish names %s (%v), want %s", id, err, rec.ID)
	}
}

// TestStaleAliasBindings binds an alias as a failed publish would leave
// it released, and as a crashed one would leave it (bound, no record, and
// older than AliasBindGrace), and checks the next publisher takes it over,
// while a fresh binding without a record (a publish in progress) is a
// conflict.
func TestStaleAliasBindings(t *testing.T) {
	r := openRepo(t)
	ghost, err := repository.NewID()
	if err != nil {
		t.Fatal(err)
	}
	// Released binding: taken over at once.
	if _, err := r.putSmall(bg(), r.keys.alias("released"), encodeBinding("released", ""), putCondition{}); err != nil {
		t.Fatal(err)
	}
	rec, _ := repotest.Publish(t, r, "released")
	if id, _ := r.ResolveAlias(bg(), "released"); id != rec.ID {
		t.Fatalf("released alias names %s, want %s", id, rec.ID)
	}
	// Fresh binding of a snapshot without a record: a publish in progress.
	if _, err := r.putSmall(bg(), r.keys.alias("busy"), encodeBinding("busy", ghost), putCondition{}); err != nil {
		t.Fatal(err)
	}
	lease := beginCapture(t, r)
	_, err = r.Publish(bg(), lease, repotest.NewInputs(t, repotest.SmallMemoryBytes).Request("busy"))
	var conflict *repository.AliasConflictError
	if !errors.As(err, &conflict) || conflict.HolderID != ghost {
		t.Fatalf("publish over a fresh binding: %v, want a conflict naming %s", err, ghost)
	}
	if _, err := r.ResolveAlias(bg(), "busy"); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("alias of a snapshot without record resolves: %v", err)
	}
	// The same binding once the grace has passed: left by a crash, taken over.
	r.aliasGrace = 0
	rec2, err := r.Publish(bg(), lease, repotest.NewInputs(t, repotest.SmallMemoryBytes).Request("busy"))
	if err != nil {
		t.Fatalf("publish over a stale binding: %v", err)
	}
	if id, _ := r.ResolveAlias(bg(), "busy"); id != rec2.ID {
		t.Fatalf("stale alias names %s, want %s", id, rec2.ID)
	}
}

func TestOpenRefusesBadOptions(t *testing.T) {
	needServer(t)
	for name, edit := range map[string]func(*Options){
		"no bucket":        func(o *Options) { o.Bucket = "" },
		"missing bucket":   func(o *Options) { o.Bucket = "no-such-bucket" },
		"bad prefix":       func(o *Options) { o.Prefix = "a/../b" },
		"bad addressing":   func(o *Options) { o.AddressingStyle = "sideways" },
		"no cache dir":     func(o *Options) { o.CacheDir = "" },
		"bad endpoint url": func(o *Options) { o.Endpoint = "ftp://x" },
	} {
		t.Run(name, func(t *testing.T) {
			o := testOptions(t, server.Endpoint)
			edit(&o)
			if r, err := Open(bg(), o); err == nil {
				r.Close()
				t.Fatal("Open accepted the options")
			}
		})
	}
}

// TestEnvironmentCredentials opens the repository with no static keys: the
// AWS environment variables of the credential chain must be used.
func TestEnvironmentCredentials(t *testing.T) {
	needServer(t)
	t.Setenv("AWS_ACCESS_KEY_ID", miniotest.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", miniotest.SecretKey)
	o := testOptions(t, server.Endpoint)
	o.AccessKeyID, o.SecretAccessKey = "", ""
	r := openWith(t, o)
	if _, err := r.List(bg(), repository.Filter{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	o.Prefix = uniquePrefix(t)
	if r, err := Open(bg(), o); err == nil {
		r.Close()
		t.Fatal("Open succeeded with a wrong secret from the environment")
	}
}

// TestCorruptRecord stores an undecodable record: Get reports
// ErrIntegrity, List leaves it out, Delete removes it.
func TestCorruptRecord(t *testing.T) {
	r := openRepo(t)
	rec, lease := repotest.Publish(t, r, "")
	lease.End()
	if _, err := r.putSmall(bg(), r.keys.record(rec.ID), []byte("{not json"), putCondition{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get(bg(), rec.ID); !errors.Is(err, repository.ErrIntegrity) {
		t.Fatalf("Get of a corrupt record: %v", err)
	}
	if recs, err := r.List(bg(), repository.Filter{}); err != nil || len(recs) != 0 {
		t.Fatalf("List = %v, %v", recs, err)
	}
	if err := r.Delete(bg(), rec.ID); err != nil {
		t.Fatal(err)
	}
	if got := snapshotKeys(t, r); len(got) != 0 {
		t.Fatalf("left after delete: %v", got)
	}
}

// TestMissingMemoryObject removes the chunk map under a record: Resolve
// reports ErrIntegrity rather than handing out a source that cannot read.
func TestMissingMemoryObject(t *testing.T) {
	r := openRepo(t)
	rec, _ := repotest.Publish(t, r, "")
	if err := r.core.RemoveObject(bg(), r.bucket, r.keys.artifact(rec.ID, chunkMapName), minio.RemoveObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Resolve(bg(), rec.ID); !errors.Is(err, repository.ErrIntegrity) {
		t.Fatalf("Resolve without memory: %v", err)
	}
}

// idAged returns a fresh UUIDv7 whose timestamp lies age in the past.
func idAged(t *testing.T, age time.Duration) string {
	t.Helper()
	u, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	ms := uint64(time.Now().Add(-age).UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	return u.String()
}

// TestSweepReclaimsOnlyOldUnpublished leaves artifacts of an old and of a
// recent id without records, next to a published snapshot: Sweep removes
// the old leftovers only.
func TestSweepReclaimsOnlyOldUnpublished(t *testing.T) {
	r := openRepo(t)
	rec, _ := repotest.Publish(t, r, "kept")
	old, recent := idAged(t, AbandonedPublishGrace+time.Minute), idAged(t, time.Minute)
	for _, id := range []string{old, recent} {
		if err := repository.ValidateID(id); err != nil {
			t.Fatal(err)
		}
		if _, err := r.putSmall(bg(), r.keys.artifact(id, repository.MemoryFileName), []byte("leftover"), putCondition{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Sweep(bg()); err != nil {
		t.Fatal(err)
	}
	keys := strings.Join(keysUnder(t, r), " ")
	if strings.Contains(keys, old) || !strings.Contains(keys, recent) {
		t.Fatalf("after sweep: %s", keys)
	}
	res, err := r.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if repotest.ResolvedMemorySHA256(t, res) != rec.MemorySHA256 {
		t.Fatal("sweep damaged a published snapshot")
	}
}
