package restore_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/prefetch"
	"warmstart/internal/recorder"
	"warmstart/internal/reference"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/trace"
	"warmstart/internal/vmm/replay"
)

func TestMain(m *testing.M) {
	replay.RunChildIfRequested()
	os.Setenv("GORACE", os.Getenv("GORACE")+" atexit_sleep_ms=0")
	os.Exit(m.Run())
}

// memoryBytes keeps the reference snapshot small enough for fast tests
// while still spanning many prefetch buffers.
const memoryBytes = 16 << 20

// env is one test's repository, FUSE mount, engine and replay VMM.
type env struct {
	repo     *posixfs.Repo
	restorer *restore.Restorer
	recorder *recorder.Recorder
	snap     reference.Snapshot
	expected string
	vm       *replay.VMM
}

func newEnv(t *testing.T, device string) *env {
	t.Helper()
	dir := t.TempDir()
	repo, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := fusedev.Mount(filepath.Join(dir, "mnt"), fusedev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	e := &env{repo: repo}
	e.vm = &replay.VMM{}
	e.restorer = &restore.Restorer{
		FUSE:       srv,
		Engine:     prefetch.NewEngine(prefetch.Options{}),
		VMM:        e.vm,
		RuntimeDir: filepath.Join(dir, "run"),
	}
	e.recorder = &recorder.Recorder{Repo: repo, Restorer: e.restorer, Device: device}
	snap, job, err := reference.Publish(context.Background(), repo, e.recorder, reference.Options{
		Dir: filepath.Join(dir, "ref"), MemoryBytes: memoryBytes, Seed: 7,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.snap = snap
	e.vm.TracePath = snap.Paths.Trace
	if _, err := job.Result(); err != nil {
		t.Fatalf("record manifest: %v", err)
	}
	entries, err := trace.ReadFile(snap.Paths.Trace)
	if err != nil {
		t.Fatal(err)
	}
	if e.expected, err = replay.ExpectedHash(snap.Paths.Memory, entries, nil); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) source(t *testing.T) restore.Source {
	t.Helper()
	r, err := e.repo.Resolve(context.Background(), e.snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	return restore.SourceOf(r)
}

var _ repository.Repository = (*posixfs.Repo)(nil)

func TestEndToEndPrefetch(t *testing.T) {
	for _, device := range []string{restore.DeviceFile, restore.DeviceUffd} {
		t.Run(device, func(t *testing.T) {
			e := newEnv(t, device)
			src := e.source(t)
			if src.Manifest == nil {
				t.Fatal("recorded snapshot has no manifest descriptor")
			}
			for _, mode := range []restore.Mode{restore.ModeOff, restore.ModeOn} {
				inst, err := e.restorer.Restore(context.Background(), src, restore.Options{Device: device, Prefetch: mode})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%s prefetch %s: ready %v, prefetch %+v, device %+v", device, mode, inst.Timings.Ready, inst.Prefetch, inst.DeviceBytes)
				if got := inst.Ready.Detail["sha256"]; got != e.expected {
					t.Errorf("prefetch %s: guest read sha256 %s, want %s", mode, got, e.expected)
				}
				if mode == restore.ModeOn && inst.Prefetch.State == "skipped" {
					t.Errorf("prefetch on was skipped: %s", inst.Prefetch.Reason)
				}
				if err := inst.Stop(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
