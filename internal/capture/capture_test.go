package capture_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"warmstart/internal/vmm/qemu/qemutest"

	"warmstart/internal/capture"
	"warmstart/internal/config"
	"warmstart/internal/initramfs"
	"warmstart/internal/lab/pagecache"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/node"
	"warmstart/internal/prefetch"
	"warmstart/internal/recorder"
	"warmstart/internal/reexec"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/restore/restoretest"
	"warmstart/internal/vmm/qemu"
)

// Bounds generous enough for TCG guests on a loaded 2-core host.
const (
	captureTimeout = 4 * time.Minute
	restoreTimeout = 2 * time.Minute
)

func TestMain(m *testing.M) {
	reexec.Roles{qemu.RoleLauncher: qemu.LauncherMain}.Dispatch()
	code := m.Run()
	guest.close()
	os.Exit(code)
}

// guestFixture is the one guest every test of the binary restores: booting
// under TCG takes about ten seconds, a restore well under one.
type guestFixture struct {
	dir    string
	repo   *posixfs.Repo
	driver *qemu.Driver
	snap   capture.Snapshot
	// rec is the background recording's outcome.
	rec recorder.Result
	// Observed while the recording's attach was held back: Publish had
	// returned, the record was visible without a manifest, and the job
	// was still running.
	visibleBeforeAttach  bool
	manifestBeforeAttach bool
	jobDoneBeforeAttach  bool

	closers []func()
	err     error
}

var (
	guest     guestFixture
	guestOnce sync.Once
)

func (g *guestFixture) close() {
	for i := len(g.closers) - 1; i >= 0; i-- {
		g.closers[i]()
	}
	if g.dir != "" {
		os.RemoveAll(g.dir)
	}
}

// gatedRepo holds AttachManifest until open is closed, so a test can look
// at the repository between publish and the background attach.
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

// captured boots, captures and publishes the shared guest on first use and
// records its manifest the way a publish with recording enabled does.
func captured(t *testing.T) *guestFixture {
	t.Helper()
	qemutest.RequireGuest(t)
	guestOnce.Do(func() { guest.err = guest.build(qemu.Options{}) })
	if guest.err != nil {
		t.Fatalf("capture the shared guest: %v", guest.err)
	}
	return &guest
}

// build boots, captures and publishes a guest of a driver with opts, and
// records its manifest in the background, as the shared guest is.
func (g *guestFixture) build(opts qemu.Options) error {
	ctx, cancel := context.WithTimeout(context.Background(), captureTimeout)
	defer cancel()
	// A short root keeps socket paths within the Unix limit.
	dir, err := os.MkdirTemp("", "wscap-")
	if err != nil {
		return err
	}
	g.dir = dir
	if g.repo, err = posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{}); err != nil {
		return err
	}
	if g.driver, err = qemu.New(opts); err != nil {
		return err
	}
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		return err
	}
	// The recorder runs on its own restorer with a one-page-readahead
	// tracing mount, which QEMU can open read-write (node.FUSEOptions).
	tr, err := node.OpenRestorer(node.TracingOptions(node.RestorerOptions{VMM: g.driver, RuntimeDir: run}, filepath.Join(dir, "trace")))
	if err != nil {
		return err
	}
	g.closers = append(g.closers, func() { tr.Close() })
	gated := &gatedRepo{Repository: g.repo, open: make(chan struct{})}
	// Two traced restores, as a node records by default: the guest's
	// start-up drifts between them (TestQEMUGuestDrift reports how much).
	rec := &recorder.Recorder{Repo: gated, Restorer: tr.Restorer, Device: config.DeviceFile, Timeout: restoreTimeout, Recordings: 2}

	snap, job, err := capture.Publish(ctx, g.repo, rec, capture.Options{
		Booter:     &capture.QEMU{Driver: g.driver, Initramfs: initramfs.Options{CacheDir: filepath.Join(dir, "initramfs")}},
		StagingDir: g.repo.Root(),
		RuntimeDir: run,
		Alias:      "guest",
	})
	if err != nil {
		return err
	}
	g.snap = snap
	select {
	case <-job.Done():
		g.jobDoneBeforeAttach = true
	default:
	}
	if r, err := g.repo.Get(ctx, snap.Record.ID); err == nil {
		g.visibleBeforeAttach = true
		g.manifestBeforeAttach = r.Manifest != nil
	}
	close(gated.open)
	if g.rec, err = job.Result(); err != nil {
		return fmt.Errorf("record the startup manifest: %w", err)
	}
	return nil
}

func TestCapturePublishesAndRecordsInBackground(t *testing.T) {
	g := captured(t)
	t.Logf("guest under %s: boot to agent %v, capture %v; manifest: %d ranges, %.1f MiB from %d touched pages, recorder ready after %v",
		g.snap.Accel, g.snap.Boot, g.snap.Capture, g.rec.Ranges, float64(g.rec.Bytes)/(1<<20), g.rec.Touches, g.rec.ReadyAfter)

	if len(g.snap.Token) != 32 {
		t.Errorf("agent token %q is not 32 hex digits", g.snap.Token)
	}
	if !g.visibleBeforeAttach || g.manifestBeforeAttach || g.jobDoneBeforeAttach {
		t.Errorf("while the attach was held: record visible %v, manifest attached %v, job done %v; want a visible record without a manifest and the recording still running",
			g.visibleBeforeAttach, g.manifestBeforeAttach, g.jobDoneBeforeAttach)
	}
	ctx := context.Background()
	rec, err := g.repo.Lookup(ctx, "guest")
	if err != nil {
		t.Fatal(err)
	}
	if rec.ID != g.snap.Record.ID {
		t.Errorf("alias guest names %s, want %s", rec.ID, g.snap.Record.ID)
	}
	if !rec.Layout.Equal(g.driver.Layout()) || rec.MemorySize != g.driver.MemoryBytes() {
		t.Errorf("record layout %s, memory %d bytes; want the driver's %s, %d bytes", rec.Layout, rec.MemorySize, g.driver.Layout(), g.driver.MemoryBytes())
	}
	if rec.Manifest == nil || *rec.Manifest != g.rec.Descriptor {
		t.Fatalf("record manifest %+v, the recording attached %+v", rec.Manifest, g.rec.Descriptor)
	}
	res, err := g.repo.Resolve(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	data, err := manifest.ReadFile(res.ManifestPath)
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Verify(data, manifest.Descriptor{SHA256: rec.Manifest.SHA256, Size: rec.Manifest.Size}, rec.Layout)
	if err != nil {
		t.Fatalf("attached manifest does not verify: %v", err)
	}
	// The agent walks its 8 MiB heap and re-reads its data files before
	// it answers a restored guest, so the manifest holds at least the
	// heap's pages; the kernel and the rest of the agent add a few MiB.
	// It must stay far below the 82 MiB recorded when QEMU's
	// MADV_HUGEPAGE advice made the kernel read 2-4 MiB around every
	// fault whatever the tracing mount's one-page readahead: the driver
	// starts QEMU so that the advice fails, as Firecracker gives none.
	if lo, hi := int64(8<<20), int64(32<<20); m.TotalBytes() < lo || m.TotalBytes() > hi {
		t.Errorf("manifest covers %.1f MiB of %d MiB; want %d to %d MiB", float64(m.TotalBytes())/(1<<20), g.driver.MemoryBytes()>>20, lo>>20, hi>>20)
	}
	if m.TotalBytes() != g.rec.Bytes || len(m.Ranges) != g.rec.Ranges {
		t.Errorf("manifest holds %d ranges, %d bytes; the recording reported %d, %d", len(m.Ranges), m.TotalBytes(), g.rec.Ranges, g.rec.Bytes)
	}
	// The capture's staging and the recorder's throwaway restore are gone.
	if left, _ := filepath.Glob(filepath.Join(g.repo.Root(), ".capture-*")); len(left) > 0 {
		t.Errorf("staging left behind: %v", left)
	}
	assertNothingLeft(t, 0, filepath.Join(g.dir, "run"))
}

// TestQEMUGuestDrift: the real guest does not start up the same way twice
// (timers, the scheduler, TCG's timing), so the two traced restores of
// one snapshot the recorder made differ. Only what must hold is asserted:
// they share pages, and the rank correlation is a number in [-1, 1]; the
// figures are logged for the README.
func TestQEMUGuestDrift(t *testing.T) {
	g := captured(t)
	a := g.rec.Agreement
	if a == nil {
		t.Fatalf("the recording compared no two runs: %+v (fallback %q)", g.rec.Recording, g.rec.Fallback)
	}
	if a.RankCorrelation == nil {
		t.Fatalf("no rank correlation over %d common pages", a.Common)
	}
	rho := *a.RankCorrelation
	t.Logf("two restores of one QEMU snapshot: %d and %d pages touched (%.1f and %.1f MiB), %d in common; overlap %.5f (%.5f of the first run, %.5f of the second); Spearman rank correlation %.6f",
		a.PagesFirst, a.PagesSecond, float64(a.PagesFirst)/256, float64(a.PagesSecond)/256, a.Common,
		a.Overlap, a.CoverFirst, a.CoverSecond, rho)
	if a.Overlap <= 0 || a.Overlap > 1 {
		t.Errorf("overlap %v, want in (0, 1]", a.Overlap)
	}
	if math.IsNaN(rho) || math.IsInf(rho, 0) || rho < -1 || rho > 1 {
		t.Errorf("rank correlation %v, want a number in [-1, 1]", rho)
	}
	rec, err := g.repo.Get(context.Background(), g.snap.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r := rec.ManifestRecording; r == nil || r.Runs != 2 || r.Overlap == nil || *r.Overlap != a.Overlap {
		t.Errorf("the record's recording %+v does not carry the two runs' overlap %v", r, a.Overlap)
	}
}

func TestPublishRefusesTakenAliasBeforeBooting(t *testing.T) {
	g := captured(t)
	dir := t.TempDir()
	// An initrd that does not exist: getting as far as booting would fail
	// differently.
	_, _, err := capture.Publish(context.Background(), g.repo, nil, capture.Options{
		Booter: &capture.QEMU{Driver: g.driver, Initrd: filepath.Join(dir, "missing.cpio")}, StagingDir: dir, RuntimeDir: dir, Alias: "guest",
	})
	var conflict *repository.AliasConflictError
	if !errors.As(err, &conflict) || conflict.HolderID != g.snap.Record.ID {
		t.Fatalf("capture under a taken alias returned %v, want an alias conflict naming %s", err, g.snap.Record.ID)
	}
}

// TestPublishFailureLeavesNothing fails a capture before the guest boots
// and checks that nothing was published or left behind. It needs no QEMU.
func TestPublishFailureLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	repo, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The driver is never asked to start anything: the initrd is missing.
	d, err := qemu.New(qemu.Options{Binary: os.Args[0], Accel: qemu.AccelTCG, Kernel: filepath.Join(dir, "vmlinuz")})
	if err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	_, job, err := capture.Publish(context.Background(), repo, nil, capture.Options{
		Booter: &capture.QEMU{Driver: d, Initrd: filepath.Join(dir, "missing.cpio")}, StagingDir: repo.Root(), RuntimeDir: run, Alias: "never",
	})
	if err == nil || job != nil {
		t.Fatalf("capture with a missing initrd returned job %v, error %v", job, err)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error %v does not say the initrd is missing", err)
	}
	recs, err := repo.List(context.Background(), repository.Filter{})
	if err != nil || len(recs) > 0 {
		t.Errorf("records after a failed capture: %v (%v)", recs, err)
	}
	if _, err := repo.ResolveAlias(context.Background(), "never"); !errors.Is(err, repository.ErrNotFound) {
		t.Errorf("alias of a failed capture: %v, want ErrNotFound", err)
	}
	for _, pattern := range []string{filepath.Join(repo.Root(), ".capture-*"), filepath.Join(run, "*")} {
		if left, _ := filepath.Glob(pattern); len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
	}
}

// restoreOnce restores src on a FUSE mount of its own, checks that the
// agent answers with the captured token, stops, unmounts, and checks that
// no QEMU process, mount or socket is left.
func restoreOnce(t *testing.T, g *guestFixture, src restore.Source, opts restore.Options) *restore.Instance {
	t.Helper()
	dir, err := os.MkdirTemp(g.dir, "r-")
	if err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(dir, "mnt")
	srv, err := fusedev.Mount(mnt, fusedev.Options{AllowWriteOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	unmounted := false
	t.Cleanup(func() {
		if !unmounted {
			srv.Close()
		}
	})
	run := filepath.Join(dir, "run")
	r := &restore.Restorer{
		Devices:    restoretest.Devices(srv, nil),
		Engine:     prefetch.NewEngine(prefetch.Options{}),
		VMM:        g.driver,
		RuntimeDir: run,
	}
	ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
	defer cancel()
	opts.Device = config.DeviceFile
	inst, err := r.Restore(ctx, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	pid := inst.Ready.Detail.PID
	if pid <= 0 {
		t.Errorf("restore reported QEMU pid %d", pid)
	}
	if got := inst.Ready.Detail.Token; got != g.snap.Token {
		inst.Stop(ctx)
		t.Fatalf("restored agent answered with token %q; the captured guest drew %q", got, g.snap.Token)
	}
	// The agent walks its heap and re-reads its files before answering a
	// restored guest's first ping; its digest of them must be the one the
	// booted guest reported.
	if got, want := inst.Ready.Detail.Digest, g.snap.Ready.Detail.Digest; want == "" || got != want {
		inst.Stop(ctx)
		t.Fatalf("restored agent's state digest %q; the captured guest's was %q", got, want)
	}
	if err := inst.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// The generation's file leaves the mount once its release is
	// acknowledged.
	if entries, err := os.ReadDir(mnt); err != nil || len(entries) != 0 {
		t.Errorf("device files left on the mount after stop: %v (%v)", entries, err)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("unmount: %v", err)
	}
	unmounted = true
	assertNothingLeft(t, pid, dir)
	return inst
}

// assertNothingLeft checks that QEMU pid has been reaped, that no process
// refers to dir, that no socket remains under it and that nothing is
// mounted under it.
func assertNothingLeft(t *testing.T, pid int, dir string) {
	t.Helper()
	if pid > 0 {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("QEMU pid %d still exists after stop (kill 0: %v)", pid, err)
		}
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), dir) {
			t.Errorf("process %s still refers to %s: %s", e.Name(), dir, strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type()&os.ModeSocket != 0 {
			t.Errorf("socket left behind: %s", p)
		}
		return nil
	})
	if mounts := mountsUnder(t, dir); len(mounts) > 0 {
		t.Errorf("still mounted: %v", mounts)
	}
}

func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var found []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// Field 5 is the mount point, with spaces escaped as \040.
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir) {
			found = append(found, fields[4])
		}
	}
	return found
}

func resolved(t *testing.T, g *guestFixture) restore.Source {
	t.Helper()
	res, err := g.repo.Resolve(context.Background(), g.snap.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	return restore.SourceOf(res)
}

func TestRestoreThroughFUSEDevice(t *testing.T) {
	g := captured(t)
	src := resolved(t, g)
	if src.Manifest == nil {
		t.Fatal("resolved snapshot carries no manifest")
	}
	warmstart, err := restore.LookupPolicy(restore.DefaultPolicy)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := restore.LookupPolicy("seed")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		opts     restore.Options
		prefetch bool
	}{
		{"prefetch-off", restore.Options{Prefetch: restore.ModeOff}, false},
		{"prefetch-on-seed", restore.Options{Prefetch: restore.ModeOn, Policy: seed}, true},
		{"prefetch-on-warmstart", restore.Options{Prefetch: restore.ModeOn, Policy: warmstart}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Cold: the lower file leaves the page cache, so every page the
			// guest needs comes through the device.
			if err := pagecache.Evict(memdev.FilePath(src.Memory)); err != nil {
				t.Fatal(err)
			}
			inst := restoreOnce(t, g, src, tc.opts)
			t.Logf("ready after %v, device read %.1f MiB in %d requests, prefetch %s %s",
				inst.Timings.Ready, float64(inst.DeviceBytes.BytesRead)/(1<<20), inst.DeviceBytes.ReadRequests, inst.Prefetch.State, inst.Prefetch.Reason)
			if inst.DeviceBytes.BytesRead == 0 {
				t.Error("the guest read nothing through the device")
			}
			if !tc.prefetch {
				if inst.Prefetch.State != "skipped" {
					t.Errorf("prefetch %s with prefetch off", inst.Prefetch.State)
				}
				// On demand, the device reads what the guest faults plus
				// the mount's 128 KiB readahead around it; with QEMU's
				// huge-page advice in effect it read 82 MiB.
				if limit := g.driver.MemoryBytes() / 2; int64(inst.DeviceBytes.BytesRead) > limit {
					t.Errorf("a cold on-demand restore read %.1f MiB through the device, more than %d MiB", float64(inst.DeviceBytes.BytesRead)/(1<<20), limit>>20)
				}
				return
			}
			if inst.Prefetch.State == "skipped" || inst.Prefetch.State == "failed" {
				t.Fatalf("prefetch %s (%s), want it running or completed", inst.Prefetch.State, inst.Prefetch.Reason)
			}
			if inst.Prefetch.PlannedBytes != g.rec.Bytes || inst.Prefetch.Digest != src.Manifest.SHA256 {
				t.Errorf("prefetch planned %d bytes of manifest %s; the attached manifest is %d bytes, %s",
					inst.Prefetch.PlannedBytes, inst.Prefetch.Digest, g.rec.Bytes, src.Manifest.SHA256)
			}
		})
	}
	// Guest writes stay in QEMU's private copies: the lower file is the
	// file that was published.
	sum, err := pagecache.HashFile(memdev.FilePath(src.Memory))
	if err != nil {
		t.Fatal(err)
	}
	if sum != g.snap.Record.MemorySHA256 {
		t.Fatalf("memory lower file sha256 %s after restores, published as %s", sum, g.snap.Record.MemorySHA256)
	}
}

// TestCorruptManifestFallsBackToOnDemand restores with a manifest that
// fails validation: the restore must skip prefetch, read on demand, and the
// guest must still answer.
func TestCorruptManifestFallsBackToOnDemand(t *testing.T) {
	g := captured(t)
	src := resolved(t, g)
	good, err := os.ReadFile(src.ManifestPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		// corrupt returns the bytes to put in place of the manifest, and
		// whether the descriptor is recomputed to match them (a manifest
		// that is what was attached but not a valid manifest).
		corrupt    func([]byte) []byte
		describe   bool
		wantReason string
	}{
		{"flipped-byte", func(b []byte) []byte { b[len(b)/2] ^= 0xff; return b }, false, "digest"},
		{"truncated", func(b []byte) []byte { return b[:len(b)-3] }, false, "size"},
		{"bad-magic-but-attached", func(b []byte) []byte { b[0] ^= 0xff; return b }, true, "corrupt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.corrupt(append([]byte(nil), good...))
			bad := src
			bad.ManifestPath = filepath.Join(t.TempDir(), repository.ManifestFileName)
			if err := os.WriteFile(bad.ManifestPath, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.describe {
				d := manifest.Describe(data)
				bad.Manifest = &d
			}
			inst := restoreOnce(t, g, bad, restore.Options{Prefetch: restore.ModeOn})
			if inst.Prefetch.State != "skipped" || !strings.Contains(inst.Prefetch.Reason, "manifest rejected ("+tc.wantReason+")") {
				t.Errorf("prefetch %s (%s), want skipped with the manifest rejected (%s)", inst.Prefetch.State, inst.Prefetch.Reason, tc.wantReason)
			}
			if inst.DeviceBytes.BytesRead == 0 {
				t.Error("the guest read nothing through the device")
			}
		})
	}
}
