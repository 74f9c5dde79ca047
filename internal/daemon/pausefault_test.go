package daemon_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/pause"
	"warmstart/internal/repository/posixfs"

	"golang.org/x/sys/unix"
)

// failedPauseLeavesSandbox checks what a pause that failed at its publish
// must leave: the sandbox listed and running, no child under alias.
func failedPauseLeavesSandbox(t *testing.T, r *running, alias string) {
	t.Helper()
	ctx := context.Background()
	info, err := r.client.Restores(ctx)
	if err != nil || len(info) != 1 || info[0].Exit != nil {
		t.Fatalf("restores after the failed pause: %+v, %v; want the sandbox running", info, err)
	}
	if s, err := r.client.Snapshot(ctx, alias); err == nil {
		t.Fatalf("a failed pause left a child: %+v", s)
	}
}

// stagedChildID is the id of the child a pause stages in runtimeDir: its
// staging directory is pause-ID-*.
func stagedChildID(runtimeDir string) (string, error) {
	dirs, err := filepath.Glob(filepath.Join(runtimeDir, pause.StagingPrefix+"*"))
	if err != nil || len(dirs) != 1 {
		return "", errors.Join(err, errors.New("not one staging directory"))
	}
	name := strings.TrimPrefix(filepath.Base(dirs[0]), pause.StagingPrefix)
	return name[:strings.LastIndex(name, "-")], nil
}

// fillUp writes path until its file system has no space left.
func fillUp(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	block := make([]byte, 1<<20)
	for i := range block {
		block[i] = byte(i) | 1
	}
	for {
		if _, err := f.Write(block); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return err
		}
	}
}

// TestPauseWhileTheStoreIsFull: the POSIX store (a small tmpfs) fills up
// just as a pause publishes its child. The pause fails naming the lack of
// space, the sandbox runs again (also with then=stop), nothing of the
// child is visible and, once it has space again, nothing it left stays
// (the repository's sweep at open reclaims it). A later pause publishes a
// child holding every page written since the restore.
func TestPauseWhileTheStoreIsFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	for _, then := range []string{api.ThenResume, api.ThenStop} {
		t.Run(then, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{})
			store := f.cfg.Backend.PosixFS.SnapshotStore
			if err := os.MkdirAll(store, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mount("tmpfs", store, "tmpfs", 0, "size=64m"); err != nil {
				t.Fatalf("mount a small tmpfs store: %v", err)
			}
			filler := filepath.Join(store, "filler")
			var failedID string
			var once sync.Once
			daemon.SetPauseStepHook(t, func(_ context.Context, _, step string) {
				if step != pause.StepPublish {
					return
				}
				once.Do(func() {
					var err error
					if failedID, err = stagedChildID(f.cfg.Runtime.Dir); err != nil {
						t.Error(err)
					}
					if err := fillUp(filler); err != nil {
						t.Errorf("fill the store: %v", err)
					}
				})
			})
			r, imp, in := pausableRestore(t, f, nil)
			ctx := context.Background()
			_, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: then})
			if err == nil {
				t.Fatal("a pause into a full store published")
			}
			if !strings.Contains(err.Error(), "no space left") {
				t.Errorf("the failed pause's error does not say why: %v", err)
			}
			failedPauseLeavesSandbox(t, r, "kid")
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
			// What the failed publish left is reclaimed at the latest by
			// the sweep a repository runs at open.
			if _, err := posixfs.Open(store, posixfs.Options{}); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(store, "snapshots", failedID)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the failed child's directory %s stays after a sweep: %v", failedID, err)
			}
			res, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
			if err != nil {
				t.Fatalf("a pause once the store has space again: %v", err)
			}
			if res.Parent != imp.ID {
				t.Fatalf("pause: %+v", res)
			}
			childReadsStamped(t, r, f, "kid")
			for _, id := range []string{imp.ID, "kid"} {
				if rep, err := r.client.VerifySnapshot(ctx, id, api.VerifyRequest{}); err != nil || !rep.OK {
					t.Fatalf("verify %s: %+v, %v", id, rep, err)
				}
			}
		})
	}
}
