package firecracker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/capture"
	"warmstart/internal/config"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/node"
	"warmstart/internal/prefetch"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/restore/restoretest"
	"warmstart/internal/vmm/firecracker"
)

// publishFlow is the path a Firecracker snapshot takes in production: boot
// → capture → publish into a POSIX repository → record the startup
// manifest in the background through a tracing FUSE mount → restores
// through the serving FUSE mount or a userfaultfd → ready → stop.
type publishFlow struct {
	driver *firecracker.Driver
	repo   *posixfs.Repo
	// gate holds the recording's attach until the test has looked at the
	// repository between publish and attach.
	gate     *gatedRepo
	serving  *fusedev.Server
	traceDir string
	run      string
	restorer *restore.Restorer
	recorder *recorder.Recorder
}

// gatedRepo holds AttachManifest until open is closed.
type gatedRepo struct {
	repository.Repository
	open chan struct{}
}

func (g *gatedRepo) AttachManifest(ctx context.Context, lease repository.Lease, data []byte, rec *repository.Recording) (repository.ManifestDescriptor, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return repository.ManifestDescriptor{}, ctx.Err()
	}
	return g.Repository.AttachManifest(ctx, lease, data, rec)
}

// requireFUSE skips where no FUSE device exists.
func requireFUSE(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("skipped: the FUSE memory device needs /dev/fuse: %v", err)
	}
}

func newPublishFlow(t *testing.T, d *firecracker.Driver, recordTimeout time.Duration) *publishFlow {
	t.Helper()
	// A short root keeps socket paths within the Unix limit.
	dir, err := os.MkdirTemp("", "wsfc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &publishFlow{driver: d, run: filepath.Join(dir, "run"), traceDir: filepath.Join(dir, "trace")}
	if f.repo, err = posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(f.run, 0o700); err != nil {
		t.Fatal(err)
	}
	// Firecracker opens the memory file read-only.
	if f.serving, err = fusedev.Mount(filepath.Join(dir, "mnt"), fusedev.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.serving.Close() })
	f.restorer = &restore.Restorer{Devices: restoretest.Devices(f.serving, nil), Engine: prefetch.NewEngine(prefetch.Options{}), VMM: d, RuntimeDir: f.run}
	tr, err := node.OpenRestorer(node.TracingOptions(node.RestorerOptions{VMM: d, RuntimeDir: f.run}, f.traceDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	f.gate = &gatedRepo{Repository: f.repo, open: make(chan struct{})}
	f.recorder = &recorder.Recorder{Repo: f.gate, Restorer: tr.Restorer, Device: config.DeviceFile, Timeout: recordTimeout}
	return f
}

// published is what publish learned.
type published struct {
	snap     capture.Snapshot
	rec      recorder.Result
	resolved repository.Resolved
	manifest *manifest.Manifest
}

// publish captures a VM booted from spec under the alias "fc", checks
// that Publish returned before the background recording attached its
// manifest, lets the attach through, and checks the record: the layout of
// the VM's machine config, the recording's manifest, no staging left.
func (f *publishFlow) publish(t *testing.T, ctx context.Context, spec firecracker.BootSpec) published {
	t.Helper()
	snap, job, err := capture.Publish(ctx, f.repo, f.recorder, capture.Options{
		Booter:     &capture.Firecracker{Driver: f.driver, Spec: spec},
		StagingDir: f.repo.Root(),
		RuntimeDir: f.run,
		Alias:      "fc",
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-job.Done():
		_, err := job.Result()
		t.Fatalf("the recording ended before its attach was let through: %v", err)
	default:
	}
	rec, err := f.repo.Lookup(ctx, "fc")
	if err != nil || rec.ID != snap.Record.ID || rec.Manifest != nil {
		t.Fatalf("between publish and attach: alias fc gives %+v (%v); want %s without a manifest", rec, err, snap.Record.ID)
	}
	close(f.gate.open)
	res, err := job.Result()
	if err != nil {
		t.Fatalf("record the startup manifest: %v", err)
	}
	t.Logf("boot to agent %v, capture %v; manifest %d ranges, %d bytes from %d touches, recorder ready after %v",
		snap.Boot, snap.Capture, res.Ranges, res.Bytes, res.Touches, res.ReadyAfter)

	p := published{snap: snap, rec: res}
	if p.resolved, err = f.repo.Resolve(ctx, snap.Record.ID); err != nil {
		t.Fatal(err)
	}
	mib := spec.MemoryMiB
	if mib == 0 {
		mib = firecracker.DefaultMemoryMiB
	}
	want, err := firecracker.MemoryLayout(firecracker.MachineConfig{VCPUCount: spec.VCPUs, MemSizeMiB: mib}, mib<<20)
	if err != nil {
		t.Fatal(err)
	}
	got := p.resolved.Record
	if !got.Layout.Equal(want) || got.MemorySize != mib<<20 || snap.Accel != "kvm" {
		t.Errorf("record layout %s, memory %d bytes, accelerator %q; want %s, %d bytes, kvm", got.Layout, got.MemorySize, snap.Accel, want, mib<<20)
	}
	if got.Manifest == nil || *got.Manifest != res.Descriptor {
		t.Fatalf("record manifest %+v, the recording attached %+v", got.Manifest, res.Descriptor)
	}
	data, err := manifest.ReadFile(p.resolved.ManifestPath)
	if err != nil {
		t.Fatal(err)
	}
	p.manifest, err = manifest.Verify(data, manifest.Descriptor{SHA256: got.Manifest.SHA256, Size: got.Manifest.Size}, got.Layout)
	if err != nil {
		t.Fatalf("attached manifest does not verify: %v", err)
	}
	if total := p.manifest.TotalBytes(); total == 0 || total >= got.MemorySize || total != res.Bytes {
		t.Errorf("manifest covers %d of %d bytes, the recording reported %d; want some memory, not all of it", total, got.MemorySize, res.Bytes)
	}
	if left, _ := filepath.Glob(filepath.Join(f.repo.Root(), ".capture-*")); len(left) > 0 {
		t.Errorf("staging left behind: %v", left)
	}
	return p
}

// restoreOnce restores the published snapshot, stops it, and checks that
// the Firecracker process is gone and that no socket or device file is
// left.
func (f *publishFlow) restoreOnce(t *testing.T, ctx context.Context, p published, opts restore.Options) *restore.Instance {
	t.Helper()
	inst, err := f.restorer.Restore(ctx, restore.SourceOf(p.resolved), opts)
	if err != nil {
		t.Fatal(err)
	}
	pid := inst.Ready.Detail.PID
	if err := inst.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s device, prefetch %s (%s): ready after %v, device read %d bytes in %d requests",
		opts.Device, inst.Prefetch.State, inst.Prefetch.Reason, inst.Timings.Ready, inst.DeviceBytes.BytesRead, inst.DeviceBytes.ReadRequests)
	if pid <= 0 {
		t.Errorf("ready detail has no firecracker pid: %v", inst.Ready.Detail)
	} else if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("firecracker pid %d still exists after stop (kill 0: %v)", pid, err)
	}
	if entries, err := os.ReadDir(f.serving.Dir()); err != nil || len(entries) != 0 {
		t.Errorf("device files left on the mount after stop: %v (%v)", entries, err)
	}
	filepath.WalkDir(f.run, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type()&os.ModeSocket != 0 {
			t.Errorf("socket left behind: %s", path)
		}
		return nil
	})
	if inst.DeviceBytes.BytesRead == 0 {
		t.Error("the guest read nothing through the memory device")
	}
	return inst
}

// checkPrefetch checks what a restore with opts reports of prefetch.
func checkPrefetch(t *testing.T, p published, opts restore.Options, inst *restore.Instance) {
	t.Helper()
	if opts.Prefetch == restore.ModeOff {
		if inst.Prefetch.State != "skipped" || inst.Prefetch.Reason != "prefetch off" {
			t.Errorf("prefetch %s (%s) with prefetch off", inst.Prefetch.State, inst.Prefetch.Reason)
		}
		return
	}
	if s := inst.Prefetch.State; s == "skipped" || s == "failed" || s == "" {
		t.Fatalf("prefetch %q (%s), want it running or completed", s, inst.Prefetch.Reason)
	}
	if inst.Prefetch.PlannedBytes != p.rec.Bytes || inst.Prefetch.Digest != p.rec.Descriptor.SHA256 {
		t.Errorf("prefetch planned %d bytes of manifest %s; the attached manifest is %d bytes, %s",
			inst.Prefetch.PlannedBytes, inst.Prefetch.Digest, p.rec.Bytes, p.rec.Descriptor.SHA256)
	}
}

// restoreCase is one restore of the published snapshot.
type restoreCase struct {
	name string
	opts restore.Options
}

func restoreCases(t *testing.T) []restoreCase {
	t.Helper()
	reap, err := restore.LookupPolicy("reap")
	if err != nil {
		t.Fatal(err)
	}
	return []restoreCase{
		{"file-prefetch-on", restore.Options{Device: config.DeviceFile, Prefetch: restore.ModeOn}},
		{"file-prefetch-off", restore.Options{Device: config.DeviceFile, Prefetch: restore.ModeOff}},
		// reap prefetches before the guest runs: the snapshot loads
		// paused and the VM is resumed once the pages are in.
		{"uffd-prefetch-on-paused", restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOn, Policy: reap}},
		{"uffd-prefetch-off", restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOff}},
	}
}

// agentToken is the token in a fake guest agent's answer.
func agentToken(answer string) string {
	_, tok, _ := strings.Cut(strings.TrimSpace(answer), " token ")
	return tok
}
