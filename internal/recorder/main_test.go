package recorder_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/lab/synth"
	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/prefetch"
	"warmstart/internal/recorder"
	"warmstart/internal/reexec"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/restore/restoretest"
	"warmstart/internal/trace"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/replay"
)

func TestMain(m *testing.M) {
	reexec.Roles{replay.RoleReplayVMM: replay.ChildMain}.Dispatch()
	os.Setenv("GORACE", os.Getenv("GORACE")+" atexit_sleep_ms=0")
	dir, err := os.MkdirTemp("", "warmstart-recorder-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	sharedDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const (
	memoryBytes   = 16 << 20
	referenceSeed = 7
	// testTimeout bounds every wait a broken implementation could make
	// endless, so that a failure reports instead of hanging the package.
	testTimeout = 20 * time.Second
)

var devices = []string{config.DeviceFile, config.DeviceUffd}

// sharedDir holds the reference snapshot files that every test publishes
// (hard-linked into each test's repository, never modified).
var sharedDir string

type referenceFiles struct {
	paths   synth.Paths
	layout  layout.Layout
	entries []trace.Entry
}

var (
	sharedOnce sync.Once
	shared     referenceFiles
	sharedErr  error
)

func sharedReference(t *testing.T) referenceFiles {
	t.Helper()
	sharedOnce.Do(func() {
		var paths synth.Paths
		paths, sharedErr = synth.Generate(context.Background(), synth.Options{MemoryBytes: memoryBytes, Seed: referenceSeed, Dir: filepath.Join(sharedDir, "reference")})
		if sharedErr != nil {
			return
		}
		spec, err := os.ReadFile(paths.Layout)
		if err != nil {
			sharedErr = err
			return
		}
		l, err := layout.Parse(string(spec), memoryBytes)
		if err != nil {
			sharedErr = err
			return
		}
		entries, err := trace.ReadFile(paths.Trace)
		if err != nil {
			sharedErr = err
			return
		}
		shared = referenceFiles{paths: paths, layout: l, entries: entries}
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// env is a repository, a FUSE mount and a restorer with a replay VMM that
// plays the reference trace, ready to record manifests.
type env struct {
	repo     *posixfs.Repo
	hooked   *hookedRepo
	srv      *fusedev.Server
	vm       *gatedVMM
	restorer *restore.Restorer
	ref      referenceFiles

	readHook atomic.Pointer[func(gen uint64, off int64, n int)]
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{ref: sharedReference(t)}
	repo, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.repo = repo
	e.hooked = &hookedRepo{Repository: repo, repo: repo}
	srv, err := fusedev.Mount(filepath.Join(dir, "mnt"), fusedev.Options{ReadHook: func(gen uint64, off int64, n int) {
		if h := e.readHook.Load(); h != nil {
			(*h)(gen, off, n)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	t.Cleanup(func() { srv.Close() })
	e.vm = &gatedVMM{VMM: replay.VMM{TracePath: e.ref.paths.Trace}}
	e.restorer = &restore.Restorer{
		Devices:    restoretest.Devices(srv, nil),
		Engine:     prefetch.NewEngine(prefetch.Options{}),
		VMM:        e.vm,
		RuntimeDir: filepath.Join(dir, "run"),
	}
	return e
}

func (e *env) recorder(device string) *recorder.Recorder {
	return &recorder.Recorder{Repo: e.hooked, Restorer: e.restorer, Device: device}
}

// publish publishes the reference snapshot and returns its lease, still held.
func (e *env) publish(t *testing.T) (string, repository.Lease) {
	t.Helper()
	ctx := context.Background()
	lease, err := e.repo.BeginCapture(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := e.repo.Publish(ctx, lease, repository.PublishRequest{
		VMStatePath: e.ref.paths.VMState, MemoryPath: e.ref.paths.Memory, Layout: e.ref.layout,
	})
	if err != nil {
		lease.End()
		t.Fatal(err)
	}
	return rec.ID, lease
}

func (e *env) setReadHook(f func(gen uint64, off int64, n int)) {
	if f == nil {
		e.readHook.Store(nil)
		return
	}
	e.readHook.Store(&f)
}

// checkGone fails unless nothing of snapshot id is visible or on disk:
// no record, no listing, no snapshot directory.
func (e *env) checkGone(t *testing.T, id string) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.repo.Get(ctx, id); !errors.Is(err, repository.ErrNotFound) {
		t.Errorf("get %s after delete: %v, want ErrNotFound", id, err)
	}
	recs, err := e.repo.List(ctx, repository.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.ID == id {
			t.Errorf("deleted snapshot %s is listed", id)
		}
	}
	for _, p := range []string{
		filepath.Join(e.repo.Root(), "catalog", "records", id+".json"),
		filepath.Join(e.repo.Root(), "snapshots", id),
	} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists after delete (%v)", p, err)
		}
	}
}

// checkAttached fails unless the record of id carries desc and the
// manifest file holds exactly data.
func (e *env) checkAttached(t *testing.T, id string, desc repository.ManifestDescriptor, data []byte) {
	t.Helper()
	if err := e.hooked.verify(id, desc, data); err != nil {
		t.Error(err)
	}
}

// hookedRepo is the repository with hooks at the points where a recording
// meets the repository, and a check after every successful attach that the
// record and the manifest file agree (or that the snapshot is gone).
type hookedRepo struct {
	repository.Repository
	repo *posixfs.Repo

	mu           sync.Mutex
	afterResolve func(id string)
	beforeAttach func(id string)
	violations   []error
}

func (h *hookedRepo) hooks() (afterResolve, beforeAttach func(string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.afterResolve, h.beforeAttach
}

func (h *hookedRepo) setHooks(afterResolve, beforeAttach func(string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.afterResolve, h.beforeAttach = afterResolve, beforeAttach
}

func (h *hookedRepo) Resolve(ctx context.Context, id string) (repository.Resolved, error) {
	r, err := h.Repository.Resolve(ctx, id)
	if after, _ := h.hooks(); after != nil {
		after(id)
	}
	return r, err
}

func (h *hookedRepo) AttachManifest(ctx context.Context, lease repository.Lease, data []byte, rec *repository.Recording) (repository.ManifestDescriptor, error) {
	if _, before := h.hooks(); before != nil {
		before(lease.SnapshotID())
	}
	desc, err := h.Repository.AttachManifest(ctx, lease, data, rec)
	if err == nil {
		if verr := h.verify(lease.SnapshotID(), desc, data); verr != nil {
			h.mu.Lock()
			h.violations = append(h.violations, verr)
			h.mu.Unlock()
		}
	}
	return desc, err
}

// verify checks that the record of id carries desc and its manifest file
// holds data; a snapshot deleted meanwhile passes.
func (h *hookedRepo) verify(id string, desc repository.ManifestDescriptor, data []byte) error {
	ctx := context.Background()
	rec, err := h.repo.Get(ctx, id)
	if errors.Is(err, repository.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if rec.Manifest == nil || *rec.Manifest != desc {
		return fmt.Errorf("snapshot %s: record descriptor %+v, attach returned %+v", id, rec.Manifest, desc)
	}
	if got := manifest.Describe(data); got.SHA256 != desc.SHA256 || got.Size != desc.Size {
		return fmt.Errorf("snapshot %s: descriptor %+v does not describe the attached bytes (%+v)", id, desc, got)
	}
	stored, err := os.ReadFile(filepath.Join(h.repo.Root(), "snapshots", id, repository.ManifestFileName))
	if errors.Is(err, os.ErrNotExist) {
		// Deleted between the two reads: then the record must be gone too.
		if _, gerr := h.repo.Get(ctx, id); !errors.Is(gerr, repository.ErrNotFound) {
			return fmt.Errorf("snapshot %s: record with descriptor but no manifest file (%v)", id, gerr)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if got := manifest.Describe(stored); got.SHA256 != desc.SHA256 || got.Size != desc.Size {
		return fmt.Errorf("snapshot %s: manifest file is %+v, record says %+v", id, got, desc)
	}
	return nil
}

func (h *hookedRepo) takeViolations() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := h.violations
	h.violations = nil
	return v
}

// gatedVMM is the replay VMM with a hook run before each VMM starts; the
// hook's error fails that start. With traces set, the nth start from then
// on plays traces[n] (the VMM's own trace past the list's end).
type gatedVMM struct {
	replay.VMM

	mu          sync.Mutex
	beforeStart func()
	startErr    func() error
	traces      []string
	starts      int
}

func (v *gatedVMM) setTraces(paths ...string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.traces, v.starts = paths, 0
}

func (v *gatedVMM) setStartErr(f func() error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.startErr = f
}

func (v *gatedVMM) setBeforeStart(f func()) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.beforeStart = f
}

func (v *gatedVMM) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	v.mu.Lock()
	before, startErr := v.beforeStart, v.startErr
	played := v.VMM
	if v.starts < len(v.traces) {
		played.TracePath = v.traces[v.starts]
	}
	v.starts++
	v.mu.Unlock()
	if before != nil {
		before()
	}
	if startErr != nil {
		if err := startErr(); err != nil {
			return nil, err
		}
	}
	return played.Restore(ctx, spec)
}

func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testTimeout):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// jobResult waits for a recording to end.
func jobResult(t *testing.T, job *recorder.Job) (recorder.Result, error) {
	t.Helper()
	waitFor(t, job.Done(), "the recording to end")
	return job.Result()
}
