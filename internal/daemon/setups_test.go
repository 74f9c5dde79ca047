package daemon_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/config"
	"warmstart/internal/daemon"
	"warmstart/internal/pause"
	"warmstart/internal/trace"
	"warmstart/internal/vmm/replay"
)

// The set-ups several tests of this package share, each in one place so a
// test reads as the behaviour it checks.

// importAs imports the fixture's reference snapshot through r under alias.
func (r *running) importAs(t *testing.T, f *fixture, alias string) api.ImportResponse {
	t.Helper()
	imp, err := r.client.Import(context.Background(), f.importRequest(alias))
	if err != nil {
		t.Fatal(err)
	}
	return imp
}

// restoreReadsHash restores snapshot id through r, stops the restore,
// and fails unless its guest read memory hashing to want (the parent's
// memory with the stamped pages).
func restoreReadsHash(t *testing.T, r *running, id, want string) {
	t.Helper()
	ctx := context.Background()
	child, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.StopRestore(ctx, child.ID); err != nil {
		t.Fatal(err)
	}
	if child.Ready.SHA256 != want {
		t.Fatalf("restore of %s read hash %s, want %s (the parent's memory with the stamped pages)", id, child.Ready.SHA256, want)
	}
}

// pauseChain is what the tests of chains of pauses start from: a daemon
// with [pause] max_depth set whose VMM is a chainVMM playing the
// reference trace, with the reference snapshot imported as "base".
type pauseChain struct {
	f    *fixture
	r    *running
	vm   *chainVMM
	ref  []trace.Entry // the reference trace
	mem  []byte        // the reference memory
	base api.ImportResponse
}

func newPauseChain(t *testing.T, maxDepth int64) pauseChain {
	t.Helper()
	f := newFixture(t, fixtureOptions{})
	f.cfg.Pause.MaxDepth = maxDepth
	vm := &chainVMM{}
	vm.set(f.ref.Trace, 0)
	r := startDaemon(t, f, func(o *daemon.Options) { o.VMM = vm })
	ref, err := trace.ReadFile(f.ref.Trace)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.ReadFile(f.ref.Memory)
	if err != nil {
		t.Fatal(err)
	}
	return pauseChain{f: f, r: r, vm: vm, ref: ref, mem: mem, base: r.importAs(t, f, "base")}
}

// generation is one pause of a chain: the pausable restore, the pause's
// answer, the offsets the guest wrote and the child's expected memory.
type generation struct {
	in      api.RestoreInfo
	res     api.PauseResult
	written []int64
	mem     []byte
}

// pauseGeneration restores parent pausable with the VMM playing the k-th
// generation's trace (generationTrace), its writes stamped with stamp,
// and pauses it into a child, then stop. The child's expected memory is
// parentMem with the written pages stamped.
func (c pauseChain) pauseGeneration(t *testing.T, parent string, parentMem []byte, k int, stamp uint64) generation {
	t.Helper()
	ctx := context.Background()
	path, written := generationTrace(t, c.f.dir, c.ref, k)
	c.vm.set(path, stamp)
	in, err := c.r.client.Restore(ctx, api.RestoreRequest{Snapshot: parent, Pausable: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.r.client.Pause(ctx, in.ID, api.PauseRequest{Then: api.ThenStop})
	if err != nil {
		t.Fatalf("pause %d: %v", k, err)
	}
	mem := bytes.Clone(parentMem)
	for _, off := range written {
		binary.LittleEndian.PutUint64(mem[off:], replay.StampOf(stamp, off))
	}
	return generation{in: in, res: res, written: written, mem: mem}
}

// tracedWrites reads the startup trace at path and returns it with the
// offsets of the pages it writes.
func tracedWrites(t *testing.T, path string) ([]trace.Entry, map[int64]bool) {
	t.Helper()
	entries, err := trace.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	written := map[int64]bool{}
	for _, e := range entries {
		if e.Write {
			written[e.Offset] = true
		}
	}
	return entries, written
}

// heldPausableRestore is pausableRestore with the first pause that reaches
// pause.StepPublish held there (holdPause) until let, or until the test
// ends.
func heldPausableRestore(t *testing.T, f *fixture, tweak func(*daemon.Options)) (*heldPause, *running, api.ImportResponse, api.RestoreInfo) {
	t.Helper()
	held := holdPause(t, pause.StepPublish)
	r, imp, in := pausableRestore(t, f, tweak)
	t.Cleanup(held.let)
	return held, r, imp, in
}

// onFirstPauseAt has the first pause that reaches step call fn, before
// the step starts (daemon.SetPauseStepHook); later pauses pass.
func onFirstPauseAt(t *testing.T, step string, fn func()) {
	var once sync.Once
	daemon.SetPauseStepHook(t, func(_ context.Context, _, s string) {
		if s == step {
			once.Do(fn)
		}
	})
}

// breakOnPublish has the first pause that reaches pause.StepPublish note
// the id of the child it staged and then call brk (what, in an error),
// which breaks the store under the publish. It returns where the id is
// noted, to read once that pause has answered.
func breakOnPublish(t *testing.T, f *fixture, what string, brk func() error) *string {
	t.Helper()
	var failedID string
	onFirstPauseAt(t, pause.StepPublish, func() {
		var err error
		if failedID, err = stagedChildID(f.cfg.Runtime.Dir); err != nil {
			t.Error(err)
		}
		if err := brk(); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	})
	return &failedID
}

// pauseStaging is the staging directory of the one pause in progress
// under f's [runtime] dir, or "" (and the test marked failed) when there
// is not exactly one; for a pause step hook.
func pauseStaging(t *testing.T, f *fixture) string {
	dirs, err := filepath.Glob(filepath.Join(f.cfg.Runtime.Dir, "pause-*"))
	if err != nil || len(dirs) != 1 {
		t.Errorf("staging: %v, %v", dirs, err)
		return ""
	}
	return dirs[0]
}

// nodeSections are the configuration sections a test daemon's node keeps
// under dir whatever its backend: its FUSE mount and runtime directory,
// its socket, the directory it imports from, and the replay VMM playing
// trace; extra follows them (a [trust] section, or nothing).
func nodeSections(dir, socket, importDir, trace, extra string) string {
	return fmt.Sprintf(`[memory]
fuse_mount = %q
[runtime]
dir = %q
[daemon]
socket = %q
import_dirs = [%q]
[vmm]
driver = "replay"
[replay]
trace = %q
%s
`, filepath.Join(dir, "mnt"), filepath.Join(dir, "run"), socket, importDir, trace, extra)
}

// writeAndLoadConfig writes text to path (children load it) and loads it.
func writeAndLoadConfig(t *testing.T, path, text string) *config.Config {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// stampingDaemon starts a daemon for f whose replay VMM stamps the pages
// its guests write (with 0x5eed until the test changes it), tweaked by
// tweak when not nil, and imports the reference snapshot as "base".
func stampingDaemon(t *testing.T, f *fixture, tweak func(*daemon.Options)) (*running, *stampedVMM, api.ImportResponse) {
	t.Helper()
	vm := &stampedVMM{trace: f.ref.Trace}
	vm.stamp.Store(0x5eed)
	r := startDaemon(t, f, func(o *daemon.Options) {
		o.VMM = vm
		if tweak != nil {
			tweak(o)
		}
	})
	return r, vm, r.importAs(t, f, "base")
}

// serveInBackground makes a daemon from opts and has it serve in the
// background; served gets what Serve returns. Shutting it down is the
// caller's (startDaemon does it when the test ends).
func serveInBackground(t *testing.T, opts daemon.Options) (*daemon.Daemon, <-chan error) {
	t.Helper()
	d, err := daemon.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- d.Serve() }()
	return d, served
}

// shutDown shuts d down, allowing it a minute, and checks that it and its
// Serve (whose result served gets) ended without an error.
func shutDown(t *testing.T, d *daemon.Daemon, served <-chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("serve: %v", err)
	}
}
