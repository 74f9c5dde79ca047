package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/pause"
)

// TestPauseWhoseStagingFillsUp: the runtime directory, where a pause
// stages the VM's state and changed pages, is a small tmpfs (the restores'
// own directories beneath it on another file system) that fills up just
// before the VMM saves the VM into it, or before the layer is built there.
// The pause answers 507 naming the staging directory, the sandbox runs
// again, and once there is space a pause publishes the child.
func TestPauseWhoseStagingFillsUp(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	for _, step := range []string{pause.StepPause, pause.StepLayer} {
		t.Run(step, func(t *testing.T) { pauseWithStagingFull(t, step) })
	}
}

func pauseWithStagingFull(t *testing.T, step string) {
	f := newFixture(t, fixtureOptions{})
	run := f.cfg.Runtime.Dir
	mountOrSkip(t, "tmpfs", run, "tmpfs", 0, "size=16m")
	// The restores' directories (where a failed pause keeps the changed
	// pages for the next) live on the fixture's disk.
	disk := filepath.Join(f.dir, "rundisk")
	if err := os.MkdirAll(disk, 0o700); err != nil {
		t.Fatal(err)
	}
	mountOrSkip(t, disk, filepath.Join(run, "daemon"), "", unix.MS_BIND, "")
	filler := filepath.Join(run, "filler")
	var once sync.Once
	daemon.SetPauseStepHook(t, func(_ context.Context, _, s string) {
		if s == step {
			once.Do(func() {
				if err := fillUp(filler); err != nil {
					t.Errorf("fill the staging file system: %v", err)
				}
			})
		}
	})
	r, imp, in := pausableRestore(t, f, nil)
	_, err := r.client.Pause(context.Background(), in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusInsufficientStorage ||
		!strings.Contains(ae.Message, "staging directory "+run) {
		t.Fatalf("pause with the staging full: %v; want 507 naming the staging directory %s", err, run)
	}
	failedPauseLeavesSandbox(t, r, "kid")
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	pauseAgainPublishes(t, r, f, in.ID, imp.ID)
}

// mountOrSkip mounts source on target (made if missing) until t ends, and
// skips t, saying why, when the mount fails.
func mountOrSkip(t *testing.T, source, target, fstype string, flags uintptr, data string) {
	t.Helper()
	if err := os.MkdirAll(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		t.Skipf("mount %s on %s: %v (a test of a full disk needs a mount of its own)", source, target, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
}

// TestPauseThenStopWhoseStopFails: with then=stop the child is published
// and then the stop fails (a mount in the restore's directory keeps the
// stop from removing it, after the VM stopped). The answer is the child,
// with stop_error saying why the stop failed, not an error: a client that
// took the pause for failed would pause again. The child restores whole.
func TestPauseThenStopWhoseStopFails(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	f := newFixture(t, fixtureOptions{})
	r, imp, in := pausableRestore(t, f, nil)
	runDir := filepath.Join(f.cfg.Runtime.Dir, "daemon", "restores", in.ID)
	if _, err := os.Stat(runDir); err != nil {
		t.Fatalf("the restore's directory: %v", err)
	}
	mountOrSkip(t, "tmpfs", filepath.Join(runDir, "busy"), "tmpfs", 0, "size=1m")
	ctx := context.Background()
	res, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
	if err != nil {
		t.Fatalf("a pause whose child was published answered an error: %v", err)
	}
	if res.Parent != imp.ID || res.Snapshot == "" || !strings.Contains(res.StopError, "busy") || res.Stop == nil {
		t.Fatalf("pause: %+v; want the child of %s, its stop and stop_error naming what failed", res, imp.ID)
	}
	if info, err := r.client.Restores(ctx); err != nil || len(info) != 0 {
		t.Fatalf("restores after the stop: %+v, %v; want none", info, err)
	}
	childReadsStamped(t, r, f, "kid")
	verifyOK(t, r.client, imp.ID, "kid")
}
