// Package memdevtest is the behaviour suite every memory device passes,
// as testing/fstest.TestFS is for file systems: TestOpener drives a
// device's memdev.Opener through the restore's use of it, with a replay
// VMM in another process faulting the memory in. The test binary that
// runs it dispatches replay.RoleReplayVMM first thing in its TestMain.
// Only tests import it.
package memdevtest

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"warmstart/internal/integrity"
	"warmstart/internal/layout"
	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/trace"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/replay"
)

// memoryBytes is the suite's memory file; pages is how many of its pages
// the guest touches, spread over all of it.
const (
	memoryBytes = 4 << 20
	pages       = 96
	pageBytes   = 4096
)

// guardTimeout fails a case that would otherwise hang; it paces nothing.
const guardTimeout = 30 * time.Second

// TestOpener runs the suite against the opener newOpener returns (a fresh
// one per case, attaching to whatever the test set up for it).
func TestOpener(t *testing.T, newOpener func(t *testing.T) memdev.Opener) {
	f := newFiles(t)
	cases := []struct {
		name string
		run  func(t *testing.T, f *files, op memdev.Opener)
	}{
		{"ServesALocalFile", testServesALocalFile},
		{"ServesMemoryOnAStore", testServesMemoryOnAStore},
		{"RefusesABadBlock", testRefusesABadBlock},
		{"EndReadsEndsAStuckRead", testEndReadsEndsAStuckRead},
		{"IDsAreApart", testIDsAreApart},
		{"TargetBringsThePlanIn", testTargetBringsThePlanIn},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, f, newOpener(t)) })
	}
}

// files are the suite's memory file, the trace its guest plays and the
// hash the replay VMM reports when every byte it read was right.
type files struct {
	dir, memory, trace string
	data               []byte
	entries            []trace.Entry
	expected           string
	table              *integrity.Table
}

func newFiles(t *testing.T) *files {
	t.Helper()
	// A uffd socket lies in each restore's directory: keep the path short.
	dir, err := os.MkdirTemp("", "mdt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &files{dir: dir, memory: filepath.Join(dir, "memory.bin"), trace: filepath.Join(dir, "startup.trace")}
	f.data = make([]byte, memoryBytes)
	rand.Read(f.data)
	if err := os.WriteFile(f.memory, f.data, 0o600); err != nil {
		t.Fatal(err)
	}
	stride := int64(memoryBytes/pageBytes/pages) * pageBytes
	for i := range int64(pages) {
		f.entries = append(f.entries, trace.Entry{Offset: i*stride + i%3*pageBytes})
	}
	if err := trace.WriteFile(f.trace, f.entries); err != nil {
		t.Fatal(err)
	}
	if f.expected, err = replay.ExpectedHash(f.memory, f.entries, nil); err != nil {
		t.Fatal(err)
	}
	b := integrity.NewBuilder(integrity.SHA256, memoryBytes)
	b.Write(f.data)
	f.table = b.Table()
	return f
}

// request asks for memory under a key and a run directory of its own.
func (f *files) request(t *testing.T, memory memdev.Source) memdev.Request {
	t.Helper()
	run, err := os.MkdirTemp(f.dir, "r")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	return memdev.Request{Key: "suite-" + filepath.Base(run), Memory: memory, RunDir: run,
		Verifier: &memdev.Verifier{Table: f.table}}
}

// guest is one VM restored on a device; ctx bounds it until it is ready.
type guest struct {
	dev  memdev.Device
	vm   *replay.VM
	spec vmm.RestoreSpec
	ctx  context.Context
}

// start configures dev and starts a replay VMM on it, connected when the
// device waits for its VMM. before runs once the device serves and before
// the VMM runs where it can (a device without Connect), else once it has
// connected.
func (f *files) start(t *testing.T, dev memdev.Device, before func()) *guest {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), guardTimeout)
	t.Cleanup(cancel)
	conn, connects := dev.(memdev.Connecter)
	if before != nil && !connects {
		before()
	}
	g := &guest{dev: dev, ctx: ctx, spec: vmm.RestoreSpec{SnapshotID: "suite", Layout: layout.Single(memoryBytes), RuntimeDir: t.TempDir()}}
	if err := dev.Configure(ctx, &g.spec); err != nil {
		t.Fatalf("configure: %v", err)
	}
	vm, err := (&replay.VMM{TracePath: f.trace, ReadyTimeout: guardTimeout}).Start(ctx, g.spec)
	if err != nil {
		if connects {
			conn.Connect(ctx, nil)
		}
		t.Fatalf("start the replay VMM: %v", err)
	}
	g.vm = vm
	t.Cleanup(func() { vm.Kill(); vm.Wait(context.Background()) })
	if connects {
		if err := conn.Connect(ctx, vm); err != nil {
			t.Fatalf("connect: %v", err)
		}
		if before != nil {
			before()
		}
	}
	return g
}

// ready waits for the guest, or for the device to stop serving it, and
// returns the guest's hash, or the error.
func (g *guest) ready() (string, error) {
	type result struct {
		info vmm.ReadyInfo
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		info, err := g.vm.WaitReady(g.ctx)
		ch <- result{info, err}
	}()
	select {
	case r := <-ch:
		return r.info.Detail["sha256"], r.err
	case <-g.dev.Done():
		g.vm.Kill()
		<-ch
		return "", errors.New("the device stopped serving: " + errString(g.dev.Err()))
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// stop ends the VM and releases the device, within the guard.
func (g *guest) stop(t *testing.T) bool {
	t.Helper()
	g.vm.RequestStop()
	ctx, cancel := context.WithTimeout(context.Background(), guardTimeout)
	defer cancel()
	g.vm.Wait(ctx)
	if e, ok := g.dev.(memdev.ReadEnder); ok {
		e.EndReads(context.Canceled)
	}
	last, err := g.dev.Release(ctx)
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	return last
}

// open opens a device for req, failing the test if it cannot.
func open(t *testing.T, op memdev.Opener, req memdev.Request) memdev.Device {
	t.Helper()
	dev, err := op.Open(req)
	if err != nil {
		t.Fatalf("open %s device: %v", op.Kind(), err)
	}
	if id := dev.ID(); id.Kind != op.Kind() {
		t.Fatalf("a %s opener opened a device of kind %q", op.Kind(), id.Kind)
	}
	return dev
}

func testServesALocalFile(t *testing.T, f *files, op memdev.Opener) {
	dev := open(t, op, f.request(t, memdev.File(f.memory)))
	g := f.start(t, dev, nil)
	got, err := g.ready()
	if err != nil || got != f.expected {
		t.Fatalf("guest read sha256 %s (%v), want %s", got, err, f.expected)
	}
	if c := dev.Counters(); c.BytesRead == 0 || c.ReadErrors != 0 {
		t.Errorf("counters %+v: want the guest's reads counted, none failed", c)
	}
	if !g.stop(t) {
		t.Error("the only holder's release was not the last")
	}
}

// storeSource is memory on an object store: its lower's reads take a
// context, which ends them (memdev.ContextReaderAt).
type storeSource struct {
	data []byte
	// damage, when set, is the byte flipped in what the store returns.
	damage int64
	// stuck makes every read wait for its context.
	stuck   bool
	entered chan struct{}
	once    sync.Once
	reads   atomic.Int64
}

func (s *storeSource) Ref() string                 { return "store:suite" }
func (s *storeSource) Open() (memdev.Lower, error) { return storeLower{s}, nil }

type storeLower struct{ s *storeSource }

func (l storeLower) ReadAt(p []byte, off int64) (int, error) {
	return l.ReadAtContext(context.Background(), p, off)
}

func (l storeLower) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	s := l.s
	s.reads.Add(1)
	if s.stuck {
		s.once.Do(func() { close(s.entered) })
		<-ctx.Done()
		return 0, context.Cause(ctx)
	}
	n := copy(p, s.data[off:])
	if d := s.damage - off; s.damage > 0 && d >= 0 && d < int64(n) {
		p[d] ^= 0x40
	}
	return n, nil
}

func (l storeLower) Size() int64  { return int64(len(l.s.data)) }
func (l storeLower) Close() error { return nil }

func testServesMemoryOnAStore(t *testing.T, f *files, op memdev.Opener) {
	src := &storeSource{data: f.data}
	dev := open(t, op, f.request(t, src))
	g := f.start(t, dev, nil)
	got, err := g.ready()
	if err != nil || got != f.expected {
		t.Fatalf("guest read sha256 %s (%v), want %s", got, err, f.expected)
	}
	if src.reads.Load() == 0 {
		t.Error("the store's lower was never read")
	}
	g.stop(t)
}

func testRefusesABadBlock(t *testing.T, f *files, op memdev.Opener) {
	src := &storeSource{data: f.data, damage: f.entries[len(f.entries)/2].Offset + 100}
	req := f.request(t, src)
	var bad atomic.Int32
	req.Verifier.OnCorrupt = func(*integrity.BlockError) { bad.Add(1) }
	var failed atomic.Int32
	req.OnReadError = func(error) { failed.Add(1) }
	dev := open(t, op, req)
	g := f.start(t, dev, nil)
	got, err := g.ready()
	if err == nil {
		t.Fatalf("the guest got ready (sha256 %s) over a bad block", got)
	}
	if bad.Load() == 0 {
		t.Error("the bad block was not reported")
	}
	if failed.Load() != 0 {
		t.Errorf("%d reads of the lower failed; the lower served every read, the check refused one", failed.Load())
	}
	if c, ok := dev.(memdev.CorruptionReporter); ok && !errors.Is(c.Corruption(), integrity.ErrCorrupt) {
		t.Errorf("Corruption() = %v, want the bad block", c.Corruption())
	}
	g.stop(t)
}

func testEndReadsEndsAStuckRead(t *testing.T, f *files, op memdev.Opener) {
	src := &storeSource{data: f.data, stuck: true, entered: make(chan struct{})}
	req := f.request(t, src)
	req.Verifier = nil
	dev := open(t, op, req)
	enderDev, ok := dev.(memdev.ReadEnder)
	if !ok {
		t.Fatalf("a %s device cannot end its reads", op.Kind())
	}
	g := f.start(t, dev, nil)
	select {
	case <-src.entered:
	case <-time.After(guardTimeout):
		t.Fatal("the guest's fault never reached the lower")
	}
	cause := errors.New("the restore is over")
	if !enderDev.EndReads(cause) {
		t.Fatal("EndReads of the only holder of a lower on a store did not say it ended reads")
	}
	if _, err := g.ready(); err == nil {
		t.Fatal("the guest got ready although its read was ended")
	}
	done := make(chan struct{})
	go func() {
		g.stop(t)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(guardTimeout):
		t.Fatal("release waited on a read whose scope had ended")
	}
}

func testIDsAreApart(t *testing.T, f *files, op memdev.Opener) {
	a := open(t, op, f.request(t, memdev.File(f.memory)))
	b := open(t, op, f.request(t, memdev.File(f.memory)))
	ctx, cancel := context.WithTimeout(context.Background(), guardTimeout)
	defer cancel()
	defer a.Release(ctx)
	defer b.Release(ctx)
	if a.ID() == b.ID() {
		t.Fatalf("two devices of different keys share the ID %+v", a.ID())
	}
}

func testTargetBringsThePlanIn(t *testing.T, f *files, op memdev.Opener) {
	dev := open(t, op, f.request(t, memdev.File(f.memory)))
	plan := make([]prefetch.Range, 0, len(f.entries))
	for _, e := range f.entries {
		plan = append(plan, prefetch.Range{Offset: e.Offset, Length: pageBytes})
	}
	fetch := func() {
		target, done, err := dev.Target(plan, memdev.TargetOptions{Fill: true, Hint: true})
		if err != nil {
			t.Fatalf("target: %v", err)
		}
		if done != nil {
			defer done()
		}
		buf := make([]byte, pageBytes)
		for _, r := range plan {
			if err := target.Fetch(context.Background(), r.Offset, buf); err != nil {
				t.Fatalf("fetch [%d, +%d): %v", r.Offset, r.Length, err)
			}
		}
	}
	g := f.start(t, dev, fetch)
	got, err := g.ready()
	if err != nil || got != f.expected {
		t.Fatalf("guest read sha256 %s (%v), want %s", got, err, f.expected)
	}
	if c := dev.Counters(); c.BytesRead < uint64(len(plan)*pageBytes) {
		t.Errorf("counters %+v after fetching %d pages", c, len(plan))
	}
	g.stop(t)
}
