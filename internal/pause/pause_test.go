package pause_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"warmstart/internal/vmm/qemu/qemutest"

	"warmstart/internal/agentspec"
	"warmstart/internal/capture"
	"warmstart/internal/initramfs"
	"warmstart/internal/node"
	"warmstart/internal/pause"
	"warmstart/internal/reexec"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/qemu"
)

func TestMain(m *testing.M) {
	reexec.Roles{qemu.RoleLauncher: qemu.LauncherMain}.Dispatch()
	if code, ok := crashChild(); ok {
		os.Exit(code)
	}
	code := m.Run()
	shared.close()
	os.Exit(code)
}

// shared is one captured guest in one store for the tests that only add
// children to it.
var (
	shared     guestFixture
	sharedOnce sync.Once
)

type guestFixture struct {
	g    *guestNode
	err  error
	done func()
}

func sharedGuest(t *testing.T, ctx context.Context) *guestNode {
	t.Helper()
	sharedOnce.Do(func() {
		dir, err := os.MkdirTemp("", "wspause-")
		if err != nil {
			shared.err = err
			return
		}
		shared.g, shared.done, shared.err = newGuestNodeIn(ctx, dir)
		if shared.err != nil {
			os.RemoveAll(dir)
		}
	})
	if shared.err != nil {
		t.Fatalf("capture the shared guest: %v", shared.err)
	}
	return shared.g
}

func (f *guestFixture) close() {
	if f.done != nil {
		f.done()
	}
}

type guestNode struct {
	dir      string
	repo     *posixfs.Repo
	restorer *restore.Restorer
	run      string
	base     string
}

// newGuestNodeIn captures a QEMU guest into a fresh POSIX repository in
// dir and opens a restorer on the file device; done closes it and removes
// dir.
func newGuestNodeIn(ctx context.Context, dir string) (g *guestNode, done func(), err error) {
	repo, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{})
	if err != nil {
		return nil, nil, err
	}
	d, err := qemu.New(qemu.Options{})
	if err != nil {
		return nil, nil, err
	}
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		return nil, nil, err
	}
	snap, _, err := capture.Publish(ctx, repo, nil, capture.Options{
		Booter:     &capture.QEMU{Driver: d, Initramfs: initramfs.Options{CacheDir: filepath.Join(dir, "initramfs")}},
		StagingDir: repo.Root(), RuntimeDir: run,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("capture: %w", err)
	}
	r, err := node.OpenRestorer(node.RestorerOptions{VMM: d, RuntimeDir: run, Mount: filepath.Join(dir, "mnt")})
	if err != nil {
		return nil, nil, err
	}
	done = func() {
		r.Close()
		os.RemoveAll(dir)
	}
	return &guestNode{dir: dir, repo: repo, restorer: r.Restorer, run: run, base: snap.Record.ID}, done, nil
}

func (g *guestNode) restore(t *testing.T, ctx context.Context, id string, pausable bool) *restore.Instance {
	t.Helper()
	res, err := g.repo.Resolve(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := g.restorer.Restore(ctx, restore.SourceOf(res), restore.Options{Pausable: pausable})
	if err != nil {
		t.Fatalf("restore %s: %v", id, err)
	}
	t.Cleanup(func() { inst.Stop(context.Background()) })
	return inst
}

func stateAgent(t *testing.T, inst *restore.Instance) vmm.StateAgent {
	t.Helper()
	a, ok := inst.VM().(vmm.StateAgent)
	if !ok {
		t.Fatalf("VM %T keeps no state", inst.VM())
	}
	return a
}

// TestQEMUPauseResumeCycles: a restored QEMU guest's agent writes state,
// the restore is paused into a child (then=stop), and a restore of the
// child reports the same state; each child of a child holds every write.
// Then one restore is paused twice while it runs on (then=resume): it
// answers after each pause, and the last child holds all five writes.
func TestQEMUPauseResumeCycles(t *testing.T) {
	qemutest.RequireGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	g := sharedGuest(t, ctx)
	const kib = 4 << 10
	want := map[string]string{}
	parent := g.base
	for i, key := range []string{"first", "second", "third"} {
		inst := g.restore(t, ctx, parent, true)
		seed := uint64(100 + i)
		got, err := stateAgent(t, inst).WriteState(ctx, key, kib, seed)
		if err != nil || got != agentspec.StateDigest(kib, seed) {
			t.Fatalf("cycle %d: WriteState = %q, %v", i, got, err)
		}
		want[key] = got
		res, err := pause.Run(ctx, g.repo, inst, pause.Request{Stop: true}, pause.Options{StagingDir: g.run})
		if err != nil {
			t.Fatalf("cycle %d: pause: %v", i, err)
		}
		if err := inst.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("cycle %d: child %s depth %d: %+v; paused %v, layer %v, publish %v, total %v", i, res.Child.ID, res.Child.Depth(),
			res.Pages, res.Timings.Paused, res.Timings.Layer, res.Timings.Publish, res.Timings.Total)
		if m, r := res.Child.Manifest, res.Child.ManifestRecording; m == nil || r == nil || r.Harvested == nil || r.Harvested.FromRestore != inst.ID || r.Harvested.WrittenPages == 0 {
			t.Fatalf("cycle %d: child's manifest %+v recorded %+v; want one harvested from restore %s with written pages", i, m, r, inst.ID)
		}
		if res.Parent != parent || res.Child.Depth() != i+1 || res.Pages.Stored == 0 {
			t.Fatalf("cycle %d: child of %s at depth %d storing %d pages; want a child of %s at depth %d storing the written pages",
				i, res.Parent, res.Child.Depth(), res.Pages.Stored, parent, i+1)
		}
		parent = res.Child.ID
	}
	checkState(t, ctx, stateAgent(t, g.restore(t, ctx, parent, false)), want)

	// then=resume: the VM runs on after each pause, and its next pause is
	// a child of the last one, holding every write.
	inst := g.restore(t, ctx, parent, true)
	agent := stateAgent(t, inst)
	for i, key := range []string{"fourth", "fifth"} {
		seed := uint64(200 + i)
		got, err := agent.WriteState(ctx, key, kib, seed)
		if err != nil || got != agentspec.StateDigest(kib, seed) {
			t.Fatalf("running cycle %d: WriteState = %q, %v", i, got, err)
		}
		want[key] = got
		res, err := pause.Run(ctx, g.repo, inst, pause.Request{}, pause.Options{StagingDir: g.run})
		if err != nil {
			t.Fatalf("running cycle %d: pause: %v", i, err)
		}
		if res.Parent != parent {
			t.Fatalf("running cycle %d: child of %s, want of %s", i, res.Parent, parent)
		}
		t.Logf("running cycle %d: child %s depth %d: %+v; paused %v, total %v", i, res.Child.ID, res.Child.Depth(), res.Pages, res.Timings.Paused, res.Timings.Total)
		checkState(t, ctx, agent, want) // the paused VM runs again
		parent = res.Child.ID
	}
	if err := inst.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	checkState(t, ctx, stateAgent(t, g.restore(t, ctx, parent, false)), want)
}

func checkState(t *testing.T, ctx context.Context, a vmm.StateAgent, want map[string]string) {
	t.Helper()
	got, err := a.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("state %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("state %v, want %v", got, want)
		}
	}
}
