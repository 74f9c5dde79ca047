package firecracker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/pause"
	"warmstart/internal/prefetch"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/restore/restoretest"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/firecracker"
)

const (
	pausePageBytes = 4096
	pauseMemMiB    = 16
)

// pauseTouched is the fake guest's working set: its markers must survive
// every pause, or a restore of the child crashes its guest.
var pauseTouched = []int64{9 << 20, 0, 5 * pausePageBytes, 1 << 20}

// pauseFlow is a published Firecracker snapshot and restorers over fake
// Firecracker processes, for pausing restores of it into children.
type pauseFlow struct {
	*publishFlow
	p      published
	record string
}

func newPauseFlow(t *testing.T, ctx context.Context) *pauseFlow {
	t.Helper()
	requireFUSE(t)
	record := filepath.Join(t.TempDir(), "requests.jsonl")
	d := pauseDriver(t, firecracker.FakeConfig{RecordPath: record})
	f := &pauseFlow{publishFlow: newPublishFlow(t, d, 30*time.Second), record: record}
	images := t.TempDir()
	spec := firecracker.BootSpec{
		Kernel: filepath.Join(images, "vmlinux"), Rootfs: filepath.Join(images, "rootfs.ext4"),
		RootfsReadOnly: true, MemoryMiB: pauseMemMiB,
	}
	for _, p := range []string{spec.Kernel, spec.Rootfs} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.p = f.publish(t, ctx, spec)
	return f
}

// pauseDriver is a driver over a fake with cfg, playing a guest with
// pauseTouched as its working set and an agent.
func pauseDriver(t *testing.T, cfg firecracker.FakeConfig) *firecracker.Driver {
	t.Helper()
	cfg.Agent, cfg.TouchPages = true, pauseTouched
	d, err := firecracker.New(firecracker.Options{
		Binary: firecracker.FakeBinary(t, cfg), EnvdAddress: "unix:agent.sock",
		PollInterval: 2 * time.Millisecond, ReadyTimeout: 20 * time.Second, StopTimeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// restorer is a restorer on the flow's devices over driver d (the flow's
// own when nil).
func (f *pauseFlow) restorer(d *firecracker.Driver) *restore.Restorer {
	if d == nil {
		return f.publishFlow.restorer
	}
	return &restore.Restorer{Devices: restoretest.Devices(f.serving, nil), Engine: prefetch.NewEngine(prefetch.Options{}), VMM: d, RuntimeDir: f.run}
}

// restore restores snapshot id with r; the restore is stopped at the end
// of the test if still running.
func (f *pauseFlow) restore(t *testing.T, ctx context.Context, r *restore.Restorer, id string, opts restore.Options) (*restore.Instance, *firecracker.Machine) {
	t.Helper()
	res, err := f.repo.Resolve(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := r.Restore(ctx, restore.SourceOf(res), opts)
	if err != nil {
		t.Fatalf("restore %s: %v", id, err)
	}
	t.Cleanup(func() { inst.Stop(context.Background()) })
	m, ok := inst.VM().(*firecracker.Machine)
	if !ok {
		t.Fatalf("restored VM is a %T", inst.VM())
	}
	return inst, m
}

// staging is a fresh staging directory for pauses.
func (f *pauseFlow) staging(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(f.run, "staging-")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func write(t *testing.T, ctx context.Context, m *firecracker.Machine, pages map[int64]uint64) {
	t.Helper()
	for off, v := range pages {
		if err := firecracker.GuestWrite(ctx, m, off, v); err != nil {
			t.Fatal(err)
		}
	}
}

// checkPages checks that the guest of m reads want.
func checkPages(t *testing.T, ctx context.Context, m *firecracker.Machine, want map[int64]uint64) {
	t.Helper()
	for off, v := range want {
		got, err := firecracker.GuestRead(ctx, m, off)
		if err != nil || got != v {
			t.Errorf("page %d holds %d (%v); the guest wrote %d", off, got, err, v)
		}
	}
}

// creates are the snapshot creates the fakes recorded since from.
func (f *pauseFlow) creates(t *testing.T, from int) []firecracker.SnapshotCreate {
	t.Helper()
	var out []firecracker.SnapshotCreate
	for _, r := range firecracker.ReadRecords(t, f.record)[from:] {
		if r.Path == "/snapshot/create" {
			var c firecracker.SnapshotCreate
			decode(t, r, &c)
			out = append(out, c)
		}
	}
	return out
}

// TestFirecrackerPauseIntoChild, on both devices: a pausable restore is
// loaded with dirty page tracking; its guest writes pages; a pause that
// fails after the Diff (cancelled at publish) publishes nothing and the VM
// runs on; the guest writes again; the next pause publishes a child that
// holds both pauses' pages, and a restore of the child reads them all.
func TestFirecrackerPauseIntoChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newPauseFlow(t, ctx)
	for i, dev := range []string{config.DeviceFile, config.DeviceUffd} {
		t.Run(dev, func(t *testing.T) {
			from := len(firecracker.ReadRecords(t, f.record))
			inst, m := f.restore(t, ctx, f.restorer(nil), f.p.resolved.Record.ID, restore.Options{Device: dev, Pausable: true})
			load := loadOf(t, inOrder(t, firecracker.ReadRecords(t, f.record)[from:], "PUT /snapshot/load")[0])
			if !load.TrackDirtyPages {
				t.Fatalf("a pausable restore loaded %+v, without dirty page tracking", load)
			}
			stamp := uint64(1000 * (i + 1))
			// A touched page, a page the snapshot holds as zero, the last page.
			first := map[int64]uint64{pauseTouched[0]: stamp + 1, 3 << 20: stamp + 2, pauseMemMiB<<20 - pausePageBytes: stamp + 3}
			write(t, ctx, m, first)

			if _, err := failAtPublish(ctx, f.repo, inst, f.staging(t)); err == nil {
				t.Fatal("a pause cancelled at publish published")
			}
			checkPages(t, ctx, m, first) // it runs on
			second := map[int64]uint64{7 << 20: stamp + 4, pauseTouched[0]: stamp + 5}
			write(t, ctx, m, second)
			res, err := pause.Run(ctx, f.repo, inst, pause.Request{Stop: true}, pause.Options{StagingDir: f.staging(t)})
			if err != nil {
				t.Fatal(err)
			}
			if err := inst.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("child %s: %+v; paused %v", res.Child.ID, res.Pages, res.Timings.Paused)
			creates := f.creates(t, from)
			if len(creates) != 2 || slices.ContainsFunc(creates, func(c firecracker.SnapshotCreate) bool {
				return c.SnapshotType != firecracker.SnapshotDiff || filepath.Base(c.MemFilePath) != "memory.diff"
			}) {
				t.Errorf("snapshot creates %+v; want two Diffs into memory.diff", creates)
			}
			// The generation ID's page changed at the load, with the
			// four pages written.
			if res.Parent != f.p.resolved.Record.ID || res.Pages.Stored != 5 {
				t.Errorf("child of %s storing %+v; want a child of %s storing the 4 written pages and the generation ID's",
					res.Parent, res.Pages, f.p.resolved.Record.ID)
			}
			want := first
			for off, v := range second {
				want[off] = v
			}
			_, child := f.restore(t, ctx, f.restorer(nil), res.Child.ID, restore.Options{Device: dev})
			checkPages(t, ctx, child, want)
			checkPages(t, ctx, child, map[int64]uint64{5 << 20: 0})
		})
	}
}

// TestFirecrackerPauseRefusals: SaveDiff refuses, before asking
// Firecracker, a VM loaded without dirty page tracking and an existing
// memory.diff; Firecracker refuses a Diff of a running VM; a staging file
// system whose holes are not exact (ramfs) is refused. Each leaves the VM
// running, and a pause after them still carries every page written.
func TestFirecrackerPauseRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newPauseFlow(t, ctx)
	id := f.p.resolved.Record.ID

	inst, m := f.restore(t, ctx, f.restorer(nil), id, restore.Options{Device: config.DeviceFile})
	from := len(firecracker.ReadRecords(t, f.record))
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.SaveDiff(ctx, vmmDiffSpec(f.staging(t))); !errors.Is(err, firecracker.ErrNotTracking) {
		t.Errorf("SaveDiff of a VM loaded without tracking: %v, want ErrNotTracking", err)
	}
	if _, err := pause.Run(ctx, f.repo, inst, pause.Request{}, pause.Options{StagingDir: f.staging(t)}); !errors.Is(err, restore.ErrNotPausable) {
		t.Errorf("pause of a restore not started pausable: %v", err)
	}
	if c := f.creates(t, from); len(c) != 0 {
		t.Errorf("the refusals sent snapshot creates %+v", c)
	}
	if err := m.Resume(); err != nil {
		t.Fatal(err)
	}

	inst, m = f.restore(t, ctx, f.restorer(nil), id, restore.Options{Device: config.DeviceFile, Pausable: true})
	written := map[int64]uint64{2 << 20: 11}
	write(t, ctx, m, written)
	var apiErr *firecracker.APIError
	if _, err := m.SaveDiff(ctx, vmmDiffSpec(f.staging(t))); !errors.As(err, &apiErr) || apiErr.StatusCode != 400 ||
		!strings.Contains(err.Error(), "save/restore unavailable while running") {
		t.Errorf("SaveDiff of a running VM: %v; want Firecracker's 400", err)
	}
	exists := f.staging(t)
	if err := os.WriteFile(filepath.Join(exists, "memory.diff"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := m.SaveDiff(ctx, vmmDiffSpec(exists)); !errors.Is(err, firecracker.ErrDiffExists) {
		t.Errorf("SaveDiff into an existing memory.diff: %v, want ErrDiffExists", err)
	}
	ramfs := mountRamfs(t)
	from = len(firecracker.ReadRecords(t, f.record))
	if _, err := pause.Run(ctx, f.repo, inst, pause.Request{}, pause.Options{StagingDir: ramfs}); !errors.Is(err, firecracker.ErrInexactHoles) {
		t.Errorf("pause staged on ramfs: %v, want ErrInexactHoles", err)
	}
	if c := f.creates(t, from); len(c) != 0 {
		t.Errorf("the refusals sent snapshot creates %+v", c)
	}
	checkPages(t, ctx, m, written)
	// Only the new page: the first must come from the VM's dirty log.
	written[4<<20] = 12
	write(t, ctx, m, map[int64]uint64{4 << 20: 12})
	res, err := pause.Run(ctx, f.repo, inst, pause.Request{Stop: true}, pause.Options{StagingDir: f.staging(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	_, child := f.restore(t, ctx, f.restorer(nil), res.Child.ID, restore.Options{Device: config.DeviceFile})
	checkPages(t, ctx, child, written)
}

// TestFirecrackerPauseKeepsForgottenPages: a Diff that Firecracker fails
// after it has reset its dirty log (sync_all of the memory file failing)
// fails the pause; the VM runs on, and the next pause's child still holds
// the pages written before it.
func TestFirecrackerPauseKeepsForgottenPages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newPauseFlow(t, ctx)
	r := f.restorer(pauseDriver(t, firecracker.FakeConfig{SyncFailures: 1}))
	for _, dev := range []string{config.DeviceFile, config.DeviceUffd} {
		t.Run(dev, func(t *testing.T) {
			inst, m := f.restore(t, ctx, r, f.p.resolved.Record.ID, restore.Options{Device: dev, Pausable: true})
			written := map[int64]uint64{6 << 20: 21, pauseTouched[2]: 22}
			write(t, ctx, m, written)
			if _, err := pause.Run(ctx, f.repo, inst, pause.Request{}, pause.Options{StagingDir: f.staging(t)}); err == nil ||
				!strings.Contains(err.Error(), "sync_all") {
				t.Fatalf("a pause whose Diff failed at sync_all: %v", err)
			}
			checkPages(t, ctx, m, written)
			// Only the new page: the others must come from what the
			// driver kept of the failed Diff.
			written[8<<20] = 23
			write(t, ctx, m, map[int64]uint64{8 << 20: 23})
			res, err := pause.Run(ctx, f.repo, inst, pause.Request{Stop: true}, pause.Options{StagingDir: f.staging(t)})
			if err != nil {
				t.Fatal(err)
			}
			if err := inst.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			_, child := f.restore(t, ctx, f.restorer(nil), res.Child.ID, restore.Options{Device: dev})
			checkPages(t, ctx, child, written)
		})
	}
}

// TestFirecrackerPauseVMExitedInDiff: a Firecracker that exits while it
// writes a Diff fails the pause with ErrDiffLost and the exit; nothing is
// published.
func TestFirecrackerPauseVMExitedInDiff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newPauseFlow(t, ctx)
	r := f.restorer(pauseDriver(t, firecracker.FakeConfig{CrashInCreate: true}))
	inst, m := f.restore(t, ctx, r, f.p.resolved.Record.ID, restore.Options{Device: config.DeviceFile, Pausable: true})
	write(t, ctx, m, map[int64]uint64{6 << 20: 31})
	before, err := f.repo.List(ctx, repository.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = pause.Run(ctx, f.repo, inst, pause.Request{Alias: "lost"}, pause.Options{StagingDir: f.staging(t)})
	if !errors.Is(err, firecracker.ErrDiffLost) || !errors.Is(err, firecracker.ErrExited) {
		t.Fatalf("a pause whose Firecracker exited in the Diff: %v; want ErrDiffLost and the exit", err)
	}
	after, err := f.repo.List(ctx, repository.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("the store lists %d snapshots after the lost pause, %d before", len(after), len(before))
	}
	if err := syscall.Kill(m.PID(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("firecracker pid %d still exists (kill 0: %v)", m.PID(), err)
	}
}

func vmmDiffSpec(dir string) vmm.DiffSpec { return vmm.DiffSpec{Dir: dir} }

// mountRamfs mounts a ramfs, whose holes are not exact: it reports a whole
// sparse file as data.
func mountRamfs(t *testing.T) string { return mountFS(t, "ramfs", "mode=0700") }

// mountFS mounts a file system of type fstype with data on a temporary
// directory until the test ends. It skips where mounting is not allowed.
func mountFS(t *testing.T, fstype, data string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount(fstype, dir, fstype, 0, data); err != nil {
		t.Skipf("skipped: mount a %s: %v", fstype, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount the %s at %s: %v", fstype, dir, err)
		}
	})
	return dir
}

// TestFirecrackerPauseResumeFails: a pause whose resume fails after the
// Diff (a vCPU does not answer) fails with the VM still paused; the next
// pause's child still holds the pages written before the first, which
// Firecracker forgot at its Diff.
func TestFirecrackerPauseResumeFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newPauseFlow(t, ctx)
	r := f.restorer(pauseDriver(t, firecracker.FakeConfig{ResumeFailures: 1}))
	inst, m := f.restore(t, ctx, r, f.p.resolved.Record.ID, restore.Options{Device: config.DeviceFile, Pausable: true})
	written := map[int64]uint64{6 << 20: 41, pauseTouched[3]: 42}
	write(t, ctx, m, written)
	if _, err := pause.Run(ctx, f.repo, inst, pause.Request{}, pause.Options{StagingDir: f.staging(t)}); err == nil ||
		!strings.Contains(err.Error(), "Failed to message the vCPUs") {
		t.Fatalf("a pause whose resume failed: %v", err)
	}
	res, err := pause.Run(ctx, f.repo, inst, pause.Request{Stop: true}, pause.Options{StagingDir: f.staging(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	_, child := f.restore(t, ctx, f.restorer(nil), res.Child.ID, restore.Options{Device: config.DeviceFile})
	checkPages(t, ctx, child, written)
}

// TestFirecrackerPauseMergeFails: a pause fails at publish, keeping its
// pages; the guest writes another page; the next pause's Diff is written
// but merging the kept pages into it fails (its staging tmpfs is full).
// A third pause's child holds the pages of both.
func TestFirecrackerPauseMergeFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newPauseFlow(t, ctx)
	inst, m := f.restore(t, ctx, f.restorer(nil), f.p.resolved.Record.ID, restore.Options{Device: config.DeviceFile, Pausable: true})
	written := map[int64]uint64{6 << 20: 51, 7 << 20: 52}
	write(t, ctx, m, written)
	if _, err := failAtPublish(ctx, f.repo, inst, f.staging(t)); err == nil {
		t.Fatal("a pause cancelled at publish published")
	}
	written[8<<20] = 53
	write(t, ctx, m, map[int64]uint64{8 << 20: 53})
	// Three pages: the Diff's state and its one changed page fit, the
	// kept pages merged into it do not.
	full := mountFS(t, "tmpfs", "size=12k,huge=never")
	if _, err := pause.Run(ctx, f.repo, inst, pause.Request{}, pause.Options{StagingDir: full}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a pause staged on a full tmpfs: %v; want it to fail merging the kept pages", err)
	}
	res, err := pause.Run(ctx, f.repo, inst, pause.Request{Stop: true}, pause.Options{StagingDir: f.staging(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := inst.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	_, child := f.restore(t, ctx, f.restorer(nil), res.Child.ID, restore.Options{Device: config.DeviceFile})
	checkPages(t, ctx, child, written)
}

// failAtPublish runs a pause of inst that fails at its publish, after the
// VMM saved (and forgot) the changed pages: its context ends there.
func failAtPublish(ctx context.Context, repo pause.Repository, inst *restore.Instance, staging string) (pause.Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	return pause.Run(ctx, repo, inst, pause.Request{}, pause.Options{StagingDir: staging, OnStep: func(step string) {
		if step == pause.StepPublish {
			cancel()
		}
	}})
}
