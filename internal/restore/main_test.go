package restore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/lab/reference"
	"warmstart/internal/lab/synth"
	"warmstart/internal/layout"
	"warmstart/internal/logtest"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/memdev/uffd"
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
	dir, err := os.MkdirTemp("", "warmstart-restore-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	sharedDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// memoryBytes keeps the reference snapshot small enough for fast tests
// while still spanning many prefetch buffers.
const memoryBytes = 16 << 20

const referenceSeed = 7

// testTimeout bounds every wait a broken implementation could make endless,
// so that a failure reports instead of hanging the package.
const testTimeout = 20 * time.Second

var devices = []string{config.DeviceFile, config.DeviceUffd}

// sharedDir holds the reference snapshot files that every test publishes
// (hard-linked into each test's repository, never modified).
var sharedDir string

type referenceFiles struct {
	paths    synth.Paths
	layout   layout.Layout
	entries  []trace.Entry
	expected string // the replay VMM's hash for a correct device
}

var (
	sharedOnce sync.Once
	shared     referenceFiles
	sharedErr  error
)

// reference synthesizes the reference snapshot once per test binary.
func sharedReference(t *testing.T) referenceFiles {
	t.Helper()
	sharedOnce.Do(func() {
		shared, sharedErr = synthesize(filepath.Join(sharedDir, "reference"))
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

func synthesize(dir string) (referenceFiles, error) {
	paths, err := synth.Generate(context.Background(), synth.Options{MemoryBytes: memoryBytes, Seed: referenceSeed, Dir: dir})
	if err != nil {
		return referenceFiles{}, err
	}
	return describeReference(paths)
}

func describeReference(paths synth.Paths) (referenceFiles, error) {
	spec, err := os.ReadFile(paths.Layout)
	if err != nil {
		return referenceFiles{}, err
	}
	l, err := layout.Parse(string(spec), memoryBytes)
	if err != nil {
		return referenceFiles{}, err
	}
	entries, err := trace.ReadFile(paths.Trace)
	if err != nil {
		return referenceFiles{}, err
	}
	expected, err := replay.ExpectedHash(paths.Memory, entries, nil)
	if err != nil {
		return referenceFiles{}, err
	}
	return referenceFiles{paths: paths, layout: l, entries: entries, expected: expected}, nil
}

// envOptions choose how newEnv prepares a test's world.
type envOptions struct {
	// device is the memory device the recorder uses; file when empty.
	device string
	// engine configures the restorer's prefetch engine.
	engine prefetch.Options
	// noManifest publishes without recording a startup manifest.
	noManifest bool
	// readAheadBytes is the FUSE mount's readahead window; the default
	// when zero.
	readAheadBytes int
	// viaReference synthesizes a fresh reference snapshot and publishes it
	// with reference.Publish, and holds the recorder's VMM until Publish
	// has returned, to show that recording does not block publishing.
	viaReference bool
}

// env is one test's repository, FUSE mount, engine and replay VMM, with one
// published reference snapshot.
type env struct {
	dir      string
	repo     *posixfs.Repo
	srv      *fusedev.Server
	restorer *restore.Restorer
	recorder *recorder.Recorder
	vm       *trackingVMM
	log      *logtest.Buffer
	observer *observer
	ref      referenceFiles
	id       string
	job      recorder.Result

	readHook atomic.Pointer[func(gen uint64, off int64, n int)]
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	if o.device == "" {
		o.device = config.DeviceFile
	}
	dir := t.TempDir()
	e := &env{dir: dir, log: &logtest.Buffer{}, observer: &observer{}}
	e.mountDevices(t, o)
	refDir := filepath.Join(dir, "reference")
	if o.viaReference {
		e.vm = &trackingVMM{VMM: replay.VMM{TracePath: synth.PathsIn(refDir).Trace}}
	} else {
		e.ref = sharedReference(t)
		e.vm = &trackingVMM{VMM: replay.VMM{TracePath: e.ref.paths.Trace}}
	}
	e.restorer = &restore.Restorer{
		Devices:    restoretest.Devices(e.srv, nil),
		Engine:     prefetch.NewEngine(o.engine),
		VMM:        e.vm,
		RuntimeDir: filepath.Join(dir, "run"),
		Log:        slog.New(slog.NewTextHandler(e.log, nil)),
		Observe:    e.observer,
	}
	e.recorder = &recorder.Recorder{Repo: e.repo, Restorer: e.restorer, Device: o.device}
	rec := e.recorder
	if o.noManifest {
		rec = nil
	}
	var job *recorder.Job
	if o.viaReference {
		job = e.publishReference(t, rec, refDir)
	} else {
		job = e.publishShared(t, rec)
	}
	if job != nil {
		var err error
		if e.job, err = job.Result(); err != nil {
			t.Fatalf("record manifest: %v", err)
		}
	}
	return e
}

// mountDevices opens the env's repository and mounts its FUSE device, whose
// read hook forwards to whatever hook a test installs later.
func (e *env) mountDevices(t *testing.T, o envOptions) {
	t.Helper()
	repo, err := posixfs.Open(filepath.Join(e.dir, "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.repo = repo
	srv, err := fusedev.Mount(filepath.Join(e.dir, "mnt"), fusedev.Options{ReadAheadBytes: o.readAheadBytes, ReadHook: func(gen uint64, off int64, n int) {
		if h := e.readHook.Load(); h != nil {
			(*h)(gen, off, n)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	t.Cleanup(func() { srv.Close() })
}

// publishReference generates and publishes a fresh reference snapshot in
// refDir, checking that recording runs behind publication; it returns the
// recording job (nil when rec is nil).
func (e *env) publishReference(t *testing.T, rec *recorder.Recorder, refDir string) *recorder.Job {
	t.Helper()
	held := make(chan struct{})
	proceed := make(chan struct{})
	e.vm.setBeforeStart(func() {
		close(held)
		<-proceed
	})
	snap, j, err := reference.Publish(context.Background(), e.repo, rec, reference.Options{Dir: refDir, MemoryBytes: memoryBytes, Seed: referenceSeed})
	if err != nil {
		close(proceed)
		t.Fatal(err)
	}
	// Publish has returned while the recorder's VMM cannot start:
	// recording runs behind publication, not inside it.
	select {
	case <-j.Done():
		t.Error("recording ended before its VMM could start")
	default:
	}
	waitFor(t, held, "the recorder's restore to start its VMM")
	e.vm.setBeforeStart(nil)
	close(proceed)
	e.id = snap.ID
	if e.ref, err = describeReference(snap.Paths); err != nil {
		t.Fatal(err)
	}
	return j
}

// publishShared publishes the shared reference files; it starts recording
// when rec is set and otherwise ends the capture lease.
func (e *env) publishShared(t *testing.T, rec *recorder.Recorder) *recorder.Job {
	t.Helper()
	ctx := context.Background()
	lease, err := e.repo.BeginCapture(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.repo.Publish(ctx, lease, repository.PublishRequest{
		VMStatePath: e.ref.paths.VMState, MemoryPath: e.ref.paths.Memory, Layout: e.ref.layout,
	})
	if err != nil {
		lease.End()
		t.Fatal(err)
	}
	e.id = r.ID
	if rec == nil {
		if err := lease.End(); err != nil {
			t.Fatal(err)
		}
		return nil
	}
	return rec.Start(ctx, lease)
}

func (e *env) source(t *testing.T) restore.Source {
	t.Helper()
	r, err := e.repo.Resolve(context.Background(), e.id)
	if err != nil {
		t.Fatal(err)
	}
	return restore.SourceOf(r)
}

// manifest decodes the snapshot's attached startup manifest.
func (e *env) manifest(t *testing.T) *manifest.Manifest {
	t.Helper()
	src := e.source(t)
	if src.Manifest == nil {
		t.Fatal("snapshot has no startup manifest")
	}
	data, err := manifest.ReadFile(src.ManifestPath)
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Verify(data, *src.Manifest, src.Layout)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// setReadHook installs f as the FUSE server's read hook (nil removes it).
func (e *env) setReadHook(f func(gen uint64, off int64, n int)) {
	if f == nil {
		e.readHook.Store(nil)
		return
	}
	e.readHook.Store(&f)
}

// restorerWithTrace is the env's restorer with a replay VMM that plays
// entries instead of the reference trace, and the hash it must report.
func (e *env) restorerWithTrace(t *testing.T, entries []trace.Entry) (*restore.Restorer, *trackingVMM, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "startup.trace")
	if err := trace.WriteFile(path, entries); err != nil {
		t.Fatal(err)
	}
	expected, err := replay.ExpectedHash(e.ref.paths.Memory, entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	vm := &trackingVMM{VMM: replay.VMM{TracePath: path}}
	r := *e.restorer
	r.VMM = vm
	return &r, vm, expected
}

// restore restores with r and stops the instance when the test ends.
func (e *env) restore(t *testing.T, r *restore.Restorer, src restore.Source, opts restore.Options) *restore.Instance {
	t.Helper()
	inst, err := restoreCleanly(t, r, src, opts)
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// restoreCleanly restores and registers the instance's stop as a cleanup;
// it is safe to call from any goroutine.
func restoreCleanly(t *testing.T, r *restore.Restorer, src restore.Source, opts restore.Options) (*restore.Instance, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	inst, err := r.Restore(ctx, src, opts)
	if err != nil {
		cancel()
		return nil, err
	}
	// The context is cancelled only once the instance has stopped: the
	// replay VMM may take a cancellation that races with its ready report
	// for one that came before it, and kill itself.
	t.Cleanup(cancel)
	t.Cleanup(func() { inst.Stop(context.Background()) })
	return inst, nil
}

func stop(t *testing.T, inst *restore.Instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := inst.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkHash fails unless the guest read exactly the lower file's bytes.
func checkHash(t *testing.T, inst *restore.Instance, want string) {
	t.Helper()
	if got := inst.Ready.Detail["sha256"]; got != want {
		t.Errorf("restore %s: guest read sha256 %q, want %q (the lower file's bytes)", inst.ID, got, want)
	}
}

// exactPolicy is the warmstart policy with a plan of exactly the
// manifest (no gaps taken along), for tests that count which recorded
// pages prefetch read, late or missed.
func exactPolicy(t *testing.T) restore.Policy {
	t.Helper()
	p := policy(t, "warmstart")
	p.GapBytes = 0
	return p
}

func policy(t *testing.T, name string) restore.Policy {
	t.Helper()
	p, err := restore.LookupPolicy(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
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

// trackingVMM starts replay VMMs and remembers them, so that a test can
// check that none outlives its restore.
type trackingVMM struct {
	replay.VMM

	mu          sync.Mutex
	started     []*replay.VM
	beforeStart func()
}

func (v *trackingVMM) setBeforeStart(f func()) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.beforeStart = f
}

func (v *trackingVMM) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	v.mu.Lock()
	before := v.beforeStart
	v.mu.Unlock()
	if before != nil {
		before()
	}
	inst, err := v.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	v.started = append(v.started, inst)
	v.mu.Unlock()
	return inst, nil
}

// last is the most recently started VMM.
func (v *trackingVMM) last(t *testing.T) *replay.VM {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.started) == 0 {
		t.Fatal("no VMM was started")
	}
	return v.started[len(v.started)-1]
}

// all returns every VMM started so far.
func (v *trackingVMM) all() []*replay.VM {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]*replay.VM(nil), v.started...)
}

// checkGone fails unless the VMM process has exited and been reaped.
func checkGone(t *testing.T, inst *replay.VM) {
	t.Helper()
	select {
	case <-inst.Exited():
	default:
		t.Errorf("replay VMM pid %d is still running", inst.PID())
		return
	}
	if err := syscall.Kill(inst.PID(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("replay VMM pid %d: signal 0 gave %v, want ESRCH (no such process)", inst.PID(), err)
	}
}

// observer records what the restorer reports.
type observer struct {
	mu        sync.Mutex
	rejected  []string
	skipped   []string
	ended     []prefetch.State
	exits     []vmm.ProcessExit
	integrity int
}

func (o *observer) IntegrityFailure(string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.integrity++
}

func (o *observer) integrityFailures() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.integrity
}

func (o *observer) ManifestRejected(reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rejected = append(o.rejected, reason)
}

func (o *observer) PrefetchSkipped(reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.skipped = append(o.skipped, reason)
}

func (o *observer) PrefetchEnded(state prefetch.State) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ended = append(o.ended, state)
}

func (o *observer) Phases(restore.Timings) {}

func (o *observer) VMExited(st vmm.ProcessExit) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.exits = append(o.exits, st)
}

func (o *observer) lastEnded(t *testing.T) prefetch.State {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.ended) == 0 {
		t.Fatal("no prefetch end was observed")
	}
	return o.ended[len(o.ended)-1]
}

func (o *observer) lastRejected() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.rejected) == 0 {
		return ""
	}
	return o.rejected[len(o.rejected)-1]
}

// readGate holds, inside the FUSE server, the first read request of each
// device generation that covers one logical offset, until it is opened.
// Reads that reach the server after opening pass straight through.
type readGate struct {
	off     int64
	arrived chan uint64 // the generation of each held read
	release chan struct{}
	opened  sync.Once

	mu   sync.Mutex
	held map[uint64]bool
}

// holdReadsAt installs a read gate for offset off on e's FUSE server.
func (e *env) holdReadsAt(t *testing.T, off int64) *readGate {
	g := &readGate{off: off, arrived: make(chan uint64, 64), release: make(chan struct{}), held: make(map[uint64]bool)}
	e.setReadHook(g.hook)
	// Cleanups run last-registered first: the gate opens before any
	// instance stops and before the server unmounts.
	t.Cleanup(g.open)
	return g
}

func (g *readGate) hook(gen uint64, off int64, n int) {
	if g.off < off || g.off >= off+int64(n) {
		return
	}
	select {
	case <-g.release:
		return
	default:
	}
	g.mu.Lock()
	if g.held[gen] {
		g.mu.Unlock()
		return
	}
	g.held[gen] = true
	g.mu.Unlock()
	g.arrived <- gen
	<-g.release
}

func (g *readGate) open() { g.opened.Do(func() { close(g.release) }) }

// farTrace touches a few pages half the memory away from off, so that
// neither the touches nor the kernel's readaround around them reach off:
// every read of off then comes from the prefetch.
func farTrace(t *testing.T, off int64) []trace.Entry {
	t.Helper()
	const pages = 8
	base := (off + memoryBytes/2) % memoryBytes &^ (trace.PageBytes - 1)
	if base+pages*trace.PageBytes > memoryBytes {
		base = memoryBytes - pages*trace.PageBytes
	}
	if d := max(base-off, off-base); d < 4<<20 {
		t.Fatalf("far trace at %d is only %d bytes from %d", base, d, off)
	}
	entries := make([]trace.Entry, pages)
	for i := range entries {
		entries[i] = trace.Entry{Offset: base + int64(i)*trace.PageBytes}
	}
	return entries
}

// TestEndToEndPrefetch is the whole flow: import → publish → asynchronous
// record → attach → restore with prefetch → ready → stop, on both devices,
// with prefetch off and on.
func TestEndToEndPrefetch(t *testing.T) {
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			e := newEnv(t, envOptions{device: device, viaReference: true})
			rec := e.checkRecordedManifest(t)
			src := e.source(t)
			m := e.manifest(t)
			for _, mode := range []restore.Mode{restore.ModeOff, restore.ModeOn} {
				e.checkEndToEndRestore(t, device, src, rec, m, mode)
			}
		})
	}
}

// checkRecordedManifest checks that the snapshot's record names the
// descriptor the recorder attached and that the manifest file matches it;
// it returns the record.
func (e *env) checkRecordedManifest(t *testing.T) repository.Record {
	t.Helper()
	rec, err := e.repo.Get(context.Background(), e.id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Manifest == nil || *rec.Manifest != e.job.Descriptor {
		t.Fatalf("record descriptor %+v, recorder attached %+v", rec.Manifest, e.job.Descriptor)
	}
	data, err := os.ReadFile(e.source(t).ManifestPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := manifest.Describe(data); got.SHA256 != rec.Manifest.SHA256 || got.Size != rec.Manifest.Size {
		t.Fatalf("manifest file is %+v, record says %+v", got, *rec.Manifest)
	}
	return rec
}

// checkEndToEndRestore restores once with the given prefetch mode, checks
// the guest's bytes, the phase order and (prefetch on) the prefetch report,
// then stops and checks the device was released.
func (e *env) checkEndToEndRestore(t *testing.T, device string, src restore.Source, rec repository.Record, m *manifest.Manifest, mode restore.Mode) {
	t.Helper()
	inst := e.restore(t, e.restorer, src, restore.Options{Device: device, Prefetch: mode})
	t.Logf("%s prefetch %s: ready %v, prefetch %+v, device %+v", device, mode, inst.Timings.Ready, inst.Prefetch, inst.DeviceBytes)
	checkHash(t, inst, e.ref.expected)
	tm := inst.Timings
	if !(0 < tm.DeviceAcquired && tm.DeviceAcquired <= tm.ManifestValidated && tm.ManifestValidated <= tm.VMStarted && tm.VMStarted <= tm.Ready) {
		t.Errorf("phases out of order: %+v", tm)
	}
	if mode == restore.ModeOn {
		p := inst.Prefetch
		if p.State == "skipped" || p.State == "failed" {
			t.Errorf("prefetch on: state %s: %s", p.State, p.Reason)
		}
		if p.Digest != rec.Manifest.SHA256 || p.PlannedBytes != m.TotalBytes() || p.Generation != inst.Generation {
			t.Errorf("prefetch report %+v, want digest %s, %d planned bytes, generation %d",
				p, rec.Manifest.SHA256, m.TotalBytes(), inst.Generation)
		}
	}
	vm := e.vm.last(t)
	stop(t, inst)
	checkGone(t, vm)
	if device == config.DeviceFile {
		e.checkGenerationReleased(t, src, inst.Generation)
	}
}

// release releases dev, a reference a test attached, and waits for the
// acknowledgement.
func release(t *testing.T, dev memdev.Device) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := dev.Release(ctx); err != nil {
		t.Error(err)
	}
}

// devicesWithConnectTimeout are the env's devices, the uffd device
// waiting d for its VMM to connect.
func (e *env) devicesWithConnectTimeout(d time.Duration) memdev.Devices {
	return memdev.Devices{fusedev.NewOpener(e.srv, nil), uffd.NewOpener(d)}
}

// memoryPath is the snapshot's memory file.
func (e *env) memoryPath(t *testing.T) string {
	t.Helper()
	return memdev.FilePath(e.source(t).Memory)
}

// checkGenerationReleased: the release was acknowledged, so the key's next
// attach gets a new generation.
func (e *env) checkGenerationReleased(t *testing.T, src restore.Source, gen uint64) {
	t.Helper()
	dev, err := e.srv.Attach(e.id, memdev.Request{Memory: src.Memory, IOEngine: 0})
	if err != nil {
		t.Fatal(err)
	}
	if dev.Generation() == gen {
		t.Errorf("generation %d still attached after stop", gen)
	}
	release(t, dev)
}
