package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/repotest"
)

// Import, record, two concurrent restores sharing one prefetch task, stop
// both, delete: the whole life of a snapshot over the API.
func TestLifecycle(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	c := r.client
	ctx := context.Background()

	if h, err := c.Health(ctx); err != nil || h.Status != "ok" {
		t.Fatalf("healthz = %+v, %v", h, err)
	}
	imp := importAndList(t, c, f)
	recordAndList(t, c, imp.ID)

	// Two concurrent restores of the same snapshot share the device
	// generation and so the prefetch task.
	infos := restoreTwiceConcurrently(t, c, f, imp.ID)
	checkSharedRestoreMetrics(t, c)
	stopBoth(t, c, infos)
	// Prefetching restores run on the prefetching mount: the daemon's
	// reference is taken there, and released once both stopped.
	if a := r.log.attrsOf("restore runs without the daemon's device reference"); a != nil {
		t.Errorf("a restore ran without the daemon's device reference: %v", a)
	}
	if a := r.log.attrsOf("device released"); a == nil || a["generation"] != strconv.FormatUint(infos[0].Generation, 10) {
		t.Errorf("device release logged %v, want generation %d", a, infos[0].Generation)
	}
	checkMetricsAfterStops(t, c, infos[0].Prefetch.PlannedBytes)
	deleteTwice(t, c, imp.ID)
}

// importAndList imports the fixture's snapshot under alias ref and checks
// that the listing holds it alone.
func importAndList(t *testing.T, c *api.Client, f *fixture) api.ImportResponse {
	t.Helper()
	ctx := context.Background()
	imp, err := c.Import(ctx, f.importRequest("ref"))
	if err != nil {
		t.Fatal(err)
	}
	if err := repository.ValidateID(imp.ID); err != nil || imp.Alias != "ref" || imp.Recording || imp.Manifest != nil {
		t.Fatalf("import = %+v (%v); want a new id, alias ref, no recording, no manifest", imp, err)
	}
	recs, err := c.Snapshots(ctx, repository.Filter{})
	if err != nil || len(recs) != 1 || recs[0].ID != imp.ID {
		t.Fatalf("list = %+v, %v; want the imported snapshot", recs, err)
	}
	return imp
}

// recordAndList records ref's manifest and checks the snapshot shows it
// and the filtered listing finds it.
func recordAndList(t *testing.T, c *api.Client, id string) {
	t.Helper()
	ctx := context.Background()
	res, err := c.RecordManifest(ctx, "ref")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Snapshot(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if info.Manifest == nil || info.Manifest.SHA256 != res.Descriptor.SHA256 || info.Files == nil || info.Files.Manifest == "" {
		t.Fatalf("after record: %+v; want manifest %s attached", info, res.Descriptor.SHA256)
	}
	withManifest := true
	if recs, err := c.Snapshots(ctx, repository.Filter{HasManifest: &withManifest, AliasPrefix: "re"}); err != nil || len(recs) != 1 {
		t.Fatalf("list has_manifest alias_prefix = %+v, %v", recs, err)
	}
}

// restoreTwiceConcurrently restores ref twice at once and checks both read
// the published bytes on one shared generation and are both held.
func restoreTwiceConcurrently(t *testing.T, c *api.Client, f *fixture, id string) [2]api.RestoreInfo {
	t.Helper()
	ctx := context.Background()
	var (
		wg    sync.WaitGroup
		infos [2]api.RestoreInfo
		errs  [2]error
	)
	for i := range infos {
		wg.Go(func() {
			infos[i], errs[i] = c.Restore(ctx, api.RestoreRequest{Snapshot: "ref", Device: "file", Prefetch: "on"})
		})
	}
	wg.Wait()
	for i, in := range infos {
		if errs[i] != nil {
			t.Fatalf("restore %d: %v", i, errs[i])
		}
		checkLifecycleRestore(t, i, in, f.expected, id)
	}
	if infos[0].Generation != infos[1].Generation || infos[0].ID == infos[1].ID {
		t.Fatalf("restores %s and %s: generations %d and %d, want one shared", infos[0].ID, infos[1].ID, infos[0].Generation, infos[1].Generation)
	}
	held, err := c.Restores(ctx)
	if err != nil || len(held) != 2 {
		t.Fatalf("GET /restores = %+v, %v; want both", held, err)
	}
	return infos
}

// checkLifecycleRestore checks restore i prefetched, read the expected
// bytes and reports the snapshot, policy and ready time.
func checkLifecycleRestore(t *testing.T, i int, in api.RestoreInfo, expected, id string) {
	t.Helper()
	if in.Prefetch.State == "skipped" {
		t.Errorf("restore %d skipped prefetch: %s", i, in.Prefetch.Reason)
	}
	if got := in.Ready.SHA256; got != expected {
		t.Errorf("restore %d: guest read sha256 %s, want %s", i, got, expected)
	}
	if in.Snapshot != id || in.Policy != "warmstart" || in.Timings.Ready <= 0 {
		t.Errorf("restore %d = %+v", i, in)
	}
}

// checkSharedRestoreMetrics: two held restores, one prefetch task, every
// phase observed twice.
func checkSharedRestoreMetrics(t *testing.T, c *api.Client) {
	t.Helper()
	m := metricsOf(t, c)
	if got := value(m, "warmstart_prefetch_tasks_started_total", nil); got != 1 {
		t.Errorf("prefetch tasks started = %v, want 1 shared by both restores", got)
	}
	for _, phase := range []string{"device_acquire", "manifest_validate", "vm_start", "ready"} {
		if got := value(m, "warmstart_restore_phase_seconds", map[string]string{"phase": phase}); got != 2 {
			t.Errorf("phase %s observed %v times, want 2", phase, got)
		}
	}
	if got := value(m, "warmstart_restores_active", nil); got != 2 {
		t.Errorf("restores active = %v, want 2", got)
	}
	if _, ok := m["warmstart_prefetch_readers_in_flight"]; !ok {
		t.Error("no readers-in-flight gauge")
	}
}

// stopBoth stops both restores, checks none is held afterwards and that a
// second stop is a 404.
func stopBoth(t *testing.T, c *api.Client, infos [2]api.RestoreInfo) {
	t.Helper()
	ctx := context.Background()
	for _, in := range infos {
		rep, err := c.StopRestore(ctx, in.ID)
		if err != nil {
			t.Fatalf("stop %s: %v", in.ID, err)
		}
		if rep.ID != in.ID {
			t.Errorf("stop report %+v for %s", rep, in.ID)
		}
	}
	if held, err := c.Restores(ctx); err != nil || len(held) != 0 {
		t.Fatalf("after stops GET /restores = %+v, %v", held, err)
	}
	if _, err := c.StopRestore(ctx, infos[0].ID); !errors.Is(err, repository.ErrNotFound) {
		t.Errorf("second stop of %s: %v, want 404", infos[0].ID, err)
	}
}

// checkMetricsAfterStops: the one shared task ended, each restore has its
// outcome, the device and repository counters moved.
func checkMetricsAfterStops(t *testing.T, c *api.Client, plannedBytes int64) {
	t.Helper()
	m := metricsOf(t, c)
	ended := value(m, "warmstart_prefetch_tasks_total", map[string]string{"outcome": "completed"}) +
		value(m, "warmstart_prefetch_tasks_total", map[string]string{"outcome": "cancelled"}) +
		value(m, "warmstart_prefetch_tasks_total", map[string]string{"outcome": "failed"})
	if ended != 1 {
		t.Errorf("prefetch tasks ended = %v, want the one shared task", ended)
	}
	if got := value(m, "warmstart_restore_prefetch_outcomes_total", nil); got != 2 {
		t.Errorf("restore prefetch outcomes = %v, want one per restore", got)
	}
	if got := value(m, "warmstart_prefetch_tasks_total", map[string]string{"outcome": "completed"}); got == 1 {
		// The warmstart policy coalesces nearby ranges, so it reads at
		// least what the manifest plans.
		if pre := value(m, "warmstart_device_read_bytes_total", map[string]string{"source": "prefetch"}); pre < float64(plannedBytes) {
			t.Errorf("prefetch bytes %v after a completed task, want at least the planned %d", pre, plannedBytes)
		}
	}
	if got := value(m, "warmstart_device_read_bytes_total", nil); got <= 0 {
		t.Errorf("device bytes = %v after restores", got)
	}
	for _, op := range []string{"begin_capture", "publish", "attach_manifest", "lookup", "resolve", "list"} {
		if got := value(m, "warmstart_repository_operation_seconds", map[string]string{"operation": op, "outcome": "ok"}); got < 1 {
			t.Errorf("repository operation %s observed %v times", op, got)
		}
	}
}

// deleteTwice deletes ref, then checks the snapshot is gone and a second
// delete is a 404.
func deleteTwice(t *testing.T, c *api.Client, id string) {
	t.Helper()
	ctx := context.Background()
	del, err := c.DeleteSnapshot(ctx, "ref")
	if err != nil || del.ID != id || del.Alias != "ref" {
		t.Fatalf("delete = %+v, %v", del, err)
	}
	if _, err := c.Snapshot(ctx, id); !errors.Is(err, repository.ErrNotFound) {
		t.Errorf("get after delete: %v, want 404", err)
	}
	if _, err := c.DeleteSnapshot(ctx, id); !errors.Is(err, repository.ErrNotFound) {
		t.Errorf("second delete: %v, want 404", err)
	}
}

// With [manifest] record_after_publish an import records the
// manifest in the background; restores with prefetch auto then use it.
func TestImportRecordsInBackground(t *testing.T) {
	f := newFixture(t, fixtureOptions{recordOnPublish: true})
	r := startDaemon(t, f, nil)
	ctx := context.Background()
	attached := r.log.logged("startup manifest attached")
	imp := r.importAs(t, f, "")
	if !imp.Recording {
		t.Fatal("import did not start recording")
	}
	<-attached
	info, err := r.client.Snapshot(ctx, imp.ID)
	if err != nil || info.Manifest == nil {
		t.Fatalf("after background recording: %+v, %v; want a manifest", info, err)
	}
	in, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: imp.ID})
	if err != nil {
		t.Fatal(err)
	}
	if in.Prefetch.State == "skipped" || in.Ready.SHA256 != f.expected || in.Device != "file" {
		t.Fatalf("restore with defaults = %+v", in)
	}
	checkStartupSetReported(t, r, in)
	if _, err := r.client.StopRestore(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
}

// checkStartupSetReported: a prefetching restore's startup set adds up,
// its ready log line carries the phases and the outcome, and the listing
// of restores repeats the startup set.
func checkStartupSetReported(t *testing.T, r *running, in api.RestoreInfo) {
	t.Helper()
	ss := in.StartupSet
	if ss.StartupSetPages == 0 || ss.InTimePages+ss.LatePages+ss.UnusedPages != ss.StartupSetPages || !ss.PrefetchRan {
		t.Errorf("startup set of a prefetching restore: %+v", ss)
	}
	// The ready line carries the phases and the startup-set outcome.
	line := r.log.attrsOf("restore ready")
	for key, want := range map[string]string{"phases": "vm_started=", "startup_set": "in_time=", "outcome": "startup set "} {
		if !strings.Contains(line[key], want) {
			t.Errorf("restore ready line: %s = %q, want it to hold %q", key, line[key], want)
		}
	}
	listed, err := r.client.Restores(context.Background())
	if err != nil || len(listed) != 1 || !reflect.DeepEqual(listed[0].StartupSet, in.StartupSet) {
		t.Errorf("GET /restores = %+v, %v; want the startup set %+v", listed, err, in.StartupSet)
	}
}

// The metrics move as restores happen: skips by reason, rejected
// manifests by reason, uffd device bytes, and the exposition lints clean.
func TestMetricsAfterRestores(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	c := r.client
	ctx := context.Background()
	imp, err := c.Import(ctx, f.importRequest("m"))
	if err != nil {
		t.Fatal(err)
	}
	before := metricsOf(t, c)

	// Before its manifest is recorded a snapshot restores on demand, and
	// asking to prefetch it is refused.
	restoreThenStop(t, c, api.RestoreRequest{Snapshot: "m", Prefetch: "auto"}, "restore without a manifest", func(in api.RestoreInfo) bool {
		return in.Prefetch.State == "skipped" && in.Ready.SHA256 == f.expected
	})
	var apiErr *api.APIError
	if _, err := c.Restore(ctx, api.RestoreRequest{Snapshot: "m", Prefetch: "on"}); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || !strings.Contains(err.Error(), "record-manifest") {
		t.Fatalf("prefetch on without a manifest: %v, want 409 saying how to record one", err)
	}
	if _, err := c.RecordManifest(ctx, imp.ID); err != nil {
		t.Fatal(err)
	}
	off := restoreThenStop(t, c, api.RestoreRequest{Snapshot: "m", Device: "uffd", Prefetch: "off"}, "uffd restore with prefetch off", func(in api.RestoreInfo) bool {
		return in.Prefetch.State == "skipped" && in.DeviceBytes.BytesRead != 0 && in.Ready.SHA256 == f.expected
	})

	// A manifest whose bytes changed on disk is rejected by its digest;
	// the restore goes on with on-demand reads.
	corruptManifest(t, c, "m")
	restoreThenStop(t, c, api.RestoreRequest{Snapshot: "m", Prefetch: "on"}, "restore with a corrupt manifest", func(in api.RestoreInfo) bool {
		return in.Prefetch.State == "skipped" && strings.Contains(in.Prefetch.Reason, "digest") && in.Ready.SHA256 == f.expected
	})

	checkMetricDeltas(t, before, metricsOf(t, c), off)
	lintMetrics(t, c)
}

// restoreThenStop restores req, fails the test (naming the restore as
// what) unless ok holds for the result, stops the restore and returns it.
func restoreThenStop(t *testing.T, c *api.Client, req api.RestoreRequest, what string, ok func(api.RestoreInfo) bool) api.RestoreInfo {
	t.Helper()
	ctx := context.Background()
	in, err := c.Restore(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !ok(in) {
		t.Fatalf("%s = %+v", what, in)
	}
	if _, err := c.StopRestore(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	return in
}

// corruptManifest flips the last byte of ref's stored manifest file, so
// that its size holds and only its digest tells.
func corruptManifest(t *testing.T, c *api.Client, ref string) {
	t.Helper()
	info, err := c.Snapshot(context.Background(), ref)
	if err != nil || info.Files == nil || info.Files.Manifest == "" {
		t.Fatalf("snapshot = %+v, %v", info, err)
	}
	data, err := os.ReadFile(info.Files.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-1] ^= 0xff
	if err := os.WriteFile(info.Files.Manifest, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkMetricDeltas checks what the three restores of
// TestMetricsAfterRestores moved; off is its uffd restore.
func checkMetricDeltas(t *testing.T, before, after map[string]*dto.MetricFamily, off api.RestoreInfo) {
	t.Helper()
	delta := func(name string, labels map[string]string) float64 {
		return value(after, name, labels) - value(before, name, labels)
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"warmstart_prefetch_tasks_total", map[string]string{"outcome": "skipped", "reason": "no_manifest"}, 1},
		{"warmstart_prefetch_tasks_total", map[string]string{"outcome": "skipped", "reason": "mode_off"}, 1},
		{"warmstart_prefetch_tasks_total", map[string]string{"outcome": "skipped", "reason": "manifest_rejected"}, 1},
		{"warmstart_manifest_validation_failures_total", map[string]string{"reason": "digest"}, 1},
		{"warmstart_restore_ready_seconds", nil, 3},
		{"warmstart_restore_ready_seconds", map[string]string{"device": "uffd", "prefetch": "off", "policy": "warmstart"}, 1},
		{"warmstart_restore_ready_seconds", map[string]string{"device": "file", "prefetch": "skipped"}, 2},
		{"warmstart_startup_set_pages_total", map[string]string{"outcome": "late"}, float64(off.StartupSet.LatePages)},
		{"warmstart_restore_phase_seconds", map[string]string{"phase": "ready"}, 3},
		{"warmstart_repository_operation_seconds", map[string]string{"operation": "attach_manifest", "outcome": "ok"}, 1},
		{"warmstart_prefetch_tasks_started_total", nil, 0},
	} {
		if got := delta(tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v moved by %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	// The uffd restore read at least what its session counted, all of it
	// on demand.
	if got := delta("warmstart_device_read_bytes_total", map[string]string{"source": "fault"}); got < float64(off.DeviceBytes.BytesRead) {
		t.Errorf("fault bytes moved by %v, want at least the uffd restore's %d", got, off.DeviceBytes.BytesRead)
	}
}

// lintMetrics fails on any lint problem promlint finds in a warmstart_
// metric of the exposition.
func lintMetrics(t *testing.T, c *api.Client) {
	t.Helper()
	text, err := c.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "warmstart_") {
			t.Errorf("metric %s: %s", p.Metric, p.Text)
		}
	}
}

func TestServesTCP(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, func(o *daemon.Options) { o.Listen = "127.0.0.1:0" })
	if !strings.HasPrefix(r.d.Endpoint(), "http://127.0.0.1:") {
		t.Fatalf("endpoint %s", r.d.Endpoint())
	}
	if _, err := r.client.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(f.cfg.Daemon.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("serving TCP, the socket %s exists (%v)", f.cfg.Daemon.Socket, err)
	}
}

// DELETE of an alias whose snapshot no longer exists (a delete elsewhere
// crashed after removing the record) releases the alias and says so; the
// alias is then free, and a second DELETE is a 404.
func TestDeleteOfADanglingAliasReleasesIt(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	c := startDaemon(t, f, nil).client
	ctx := context.Background()
	imp, err := c.Import(ctx, f.importRequest("ghost"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(f.cfg.Backend.PosixFS.SnapshotStore, "catalog", "records", imp.ID+".json")); err != nil {
		t.Fatal(err)
	}
	del, err := c.DeleteSnapshot(ctx, "ghost")
	if want := (api.DeleteResponse{ID: imp.ID, Alias: "ghost", Released: true}); err != nil || del != want {
		t.Fatalf("delete of a dangling alias = %+v, %v; want %+v", del, err, want)
	}
	if _, err := c.DeleteSnapshot(ctx, "ghost"); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("second delete: %v, want 404", err)
	}
	if _, err := c.Import(ctx, f.importRequest("ghost")); err != nil {
		t.Fatalf("import of the released alias: %v", err)
	}
}

// An alias whose snapshot's record is gone (a delete elsewhere crashed
// after removing it) is swept away when the daemon opens its POSIX store;
// a DELETE of that alias then says the alias was released, naming the
// missing snapshot, as `snapshot delete` in process does, not that no
// snapshot had it.
func TestDeleteOfAnAliasSweptAtOpenReleasesIt(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	store := f.cfg.Backend.PosixFS.SnapshotStore
	repo, err := posixfs.Open(store, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec, lease := repotest.PublishInputs(t, repo, repotest.NewInputs(t, 1<<20), "swept")
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(store, "catalog", "records", rec.ID+".json")); err != nil {
		t.Fatal(err)
	}
	c := startDaemon(t, f, nil).client
	del, err := c.DeleteSnapshot(context.Background(), "swept")
	if want := (api.DeleteResponse{ID: rec.ID, Alias: "swept", Released: true}); err != nil || del != want {
		t.Fatalf("delete of an alias swept at open = %+v, %v; want %+v", del, err, want)
	}
}

// GET /snapshots marks a record whose alias is bound to no snapshot with
// its alias_mismatch, and verifying that snapshot reports it, as the CLI
// does in process.
func TestListingAndVerifyReportAnAliasMismatch(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	c := startDaemon(t, f, nil).client
	ctx := context.Background()
	imp, err := c.Import(ctx, f.importRequest("ref"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(f.cfg.Backend.PosixFS.SnapshotStore, "catalog", "records", imp.ID+".json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(data), `"alias": "ref"`, `"alias": "other"`, 1)
	if err := os.WriteFile(path, []byte(edited), 0o644); err != nil || edited == string(data) {
		t.Fatalf("retag the record: %v", err)
	}
	rows, err := c.Catalog(ctx, repository.Filter{})
	want := repository.AliasMismatch{Alias: "other", ID: imp.ID, Carries: "other"}
	if err != nil || len(rows) != 1 || rows[0].AliasMismatch == nil || *rows[0].AliasMismatch != want {
		t.Fatalf("GET /snapshots = %+v, %v; want one row with alias_mismatch %+v", rows, err, want)
	}
	rep, err := c.VerifySnapshot(ctx, imp.ID, api.VerifyRequest{})
	if err != nil || rep.OK || len(rep.Problems) != 1 || rep.Problems[0].Message != want.String() {
		t.Fatalf("verify = %+v, %v; want the problem %q", rep, err, want.String())
	}
}
