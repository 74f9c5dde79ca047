package daemon_test

import (
	"context"
	"errors"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"warmstart/internal/daemon"
	"warmstart/internal/repository"
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

	res, err := c.RecordManifest(ctx, "ref")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Snapshot(ctx, imp.ID)
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

	// Two concurrent restores of the same snapshot share the device
	// generation and so the prefetch task.
	var (
		wg    sync.WaitGroup
		infos [2]daemon.RestoreInfo
		errs  [2]error
	)
	for i := range infos {
		wg.Go(func() {
			infos[i], errs[i] = c.Restore(ctx, daemon.RestoreRequest{Snapshot: "ref", Device: "file", Prefetch: "on"})
		})
	}
	wg.Wait()
	for i, in := range infos {
		if errs[i] != nil {
			t.Fatalf("restore %d: %v", i, errs[i])
		}
		if in.Prefetch.State == "skipped" {
			t.Errorf("restore %d skipped prefetch: %s", i, in.Prefetch.Reason)
		}
		if got := in.Ready["sha256"]; got != f.expected {
			t.Errorf("restore %d: guest read sha256 %s, want %s", i, got, f.expected)
		}
		if in.Snapshot != imp.ID || in.Policy != "warmstart" || in.Timings.Ready <= 0 {
			t.Errorf("restore %d = %+v", i, in)
		}
	}
	if infos[0].Generation != infos[1].Generation || infos[0].ID == infos[1].ID {
		t.Fatalf("restores %s and %s: generations %d and %d, want one shared", infos[0].ID, infos[1].ID, infos[0].Generation, infos[1].Generation)
	}
	held, err := c.Restores(ctx)
	if err != nil || len(held) != 2 {
		t.Fatalf("GET /restores = %+v, %v; want both", held, err)
	}

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
	m = metricsOf(t, c)
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
		if pre := value(m, "warmstart_device_read_bytes_total", map[string]string{"source": "prefetch"}); pre < float64(infos[0].Prefetch.PlannedBytes) {
			t.Errorf("prefetch bytes %v after a completed task, want at least the planned %d", pre, infos[0].Prefetch.PlannedBytes)
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

	del, err := c.DeleteSnapshot(ctx, "ref")
	if err != nil || del.ID != imp.ID || del.Alias != "ref" {
		t.Fatalf("delete = %+v, %v", del, err)
	}
	if _, err := c.Snapshot(ctx, imp.ID); !errors.Is(err, repository.ErrNotFound) {
		t.Errorf("get after delete: %v, want 404", err)
	}
	if _, err := c.DeleteSnapshot(ctx, imp.ID); !errors.Is(err, repository.ErrNotFound) {
		t.Errorf("second delete: %v, want 404", err)
	}
}

// With [snapshot.memory_startup_pack] enabled an import records the
// manifest in the background; restores with prefetch auto then use it.
func TestImportRecordsInBackground(t *testing.T) {
	f := newFixture(t, fixtureOptions{recordOnPublish: true})
	r := startDaemon(t, f, nil)
	ctx := context.Background()
	attached := r.log.logged("startup manifest attached")
	imp, err := r.client.Import(ctx, f.importRequest(""))
	if err != nil {
		t.Fatal(err)
	}
	if !imp.Recording {
		t.Fatal("import did not start recording")
	}
	<-attached
	info, err := r.client.Snapshot(ctx, imp.ID)
	if err != nil || info.Manifest == nil {
		t.Fatalf("after background recording: %+v, %v; want a manifest", info, err)
	}
	in, err := r.client.Restore(ctx, daemon.RestoreRequest{Snapshot: imp.ID})
	if err != nil {
		t.Fatal(err)
	}
	if in.Prefetch.State == "skipped" || in.Ready["sha256"] != f.expected || in.Device != "file" {
		t.Fatalf("restore with defaults = %+v", in)
	}
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
	listed, err := r.client.Restores(ctx)
	if err != nil || len(listed) != 1 || !reflect.DeepEqual(listed[0].StartupSet, in.StartupSet) {
		t.Errorf("GET /restores = %+v, %v; want the startup set %+v", listed, err, in.StartupSet)
	}
	if _, err := r.client.StopRestore(ctx, in.ID); err != nil {
		t.Fatal(err)
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

	// Before its manifest is recorded a snapshot restores on demand.
	bare, err := c.Restore(ctx, daemon.RestoreRequest{Snapshot: "m", Prefetch: "on"})
	if err != nil {
		t.Fatal(err)
	}
	if bare.Prefetch.State != "skipped" || bare.Ready["sha256"] != f.expected {
		t.Fatalf("restore without a manifest = %+v", bare)
	}
	if _, err := c.StopRestore(ctx, bare.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RecordManifest(ctx, imp.ID); err != nil {
		t.Fatal(err)
	}

	off, err := c.Restore(ctx, daemon.RestoreRequest{Snapshot: "m", Device: "uffd", Prefetch: "off"})
	if err != nil {
		t.Fatal(err)
	}
	if off.Prefetch.State != "skipped" || off.DeviceBytes.BytesRead == 0 || off.Ready["sha256"] != f.expected {
		t.Fatalf("uffd restore with prefetch off = %+v", off)
	}
	if _, err := c.StopRestore(ctx, off.ID); err != nil {
		t.Fatal(err)
	}

	// A manifest whose bytes changed on disk is rejected by its digest;
	// the restore goes on with on-demand reads.
	info, err := c.Snapshot(ctx, "m")
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
	rejected, err := c.Restore(ctx, daemon.RestoreRequest{Snapshot: "m", Prefetch: "on"})
	if err != nil {
		t.Fatal(err)
	}
	if rejected.Prefetch.State != "skipped" || !strings.Contains(rejected.Prefetch.Reason, "digest") || rejected.Ready["sha256"] != f.expected {
		t.Fatalf("restore with a corrupt manifest = %+v", rejected)
	}
	if _, err := c.StopRestore(ctx, rejected.ID); err != nil {
		t.Fatal(err)
	}

	after := metricsOf(t, c)
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

	text, err := c.Metrics(ctx)
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
