package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/api"
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
	onFirstPauseAt(t, step, func() {
		if err := fillUp(filler); err != nil {
			t.Errorf("fill the staging file system: %v", err)
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

// TestImportIntoAFullStore: an import into a POSIX store with no space
// left answers 507 naming the file it could not write, and publishes
// nothing; once there is space the same import publishes.
func TestImportIntoAFullStore(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	f := newFixture(t, fixtureOptions{})
	store := f.cfg.Backend.PosixFS.SnapshotStore
	mountOrSkip(t, "tmpfs", store, "tmpfs", 0, "size=64m")
	r := startDaemon(t, f, nil)
	filler := filepath.Join(store, "filler")
	if err := fillUp(filler); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err := r.client.Import(ctx, f.importRequest("base"))
	var ae *api.APIError
	// The body keeps the head and the tail of a long error (bounded), so
	// the store's own path may be cut; the tail names the file in it.
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusInsufficientStorage ||
		!strings.Contains(ae.Message, "/snapshots/") || !strings.HasSuffix(ae.Message, "no space left on device") {
		t.Fatalf("import into a full store: %v; want 507 naming the file in %s/snapshots it could not write", err, store)
	}
	if s, err := r.client.Snapshot(ctx, "base"); err == nil {
		t.Fatalf("the failed import published %+v", s)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := r.client.Import(ctx, f.importRequest("base")); err != nil {
		t.Fatalf("import once there is space: %v", err)
	}
}
