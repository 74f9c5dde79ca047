package pause_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
	"warmstart/internal/vmm/qemu/qemutest"

	"warmstart/internal/agentspec"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/node"
	"warmstart/internal/pause"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/qemu"
)

// The crash child: a process of this test binary that restores a
// snapshot pausable, has its guest write state and pauses it, killing
// itself with SIGKILL just before the step it is told.
const (
	envCrashStep = "WARMSTART_PAUSE_CRASH_STEP"
	envCrashDir  = "WARMSTART_PAUSE_CRASH_DIR"
	envCrashBase = "WARMSTART_PAUSE_CRASH_BASE"
	crashSeed    = 7
	crashKiB     = 1 << 10
)

// crashChild runs the crash child when the environment asks for it and
// returns its exit code; ok is false in the test process itself.
func crashChild() (code int, ok bool) {
	step := os.Getenv(envCrashStep)
	if step == "" {
		return 0, false
	}
	if err := runCrashChild(step, os.Getenv(envCrashDir), os.Getenv(envCrashBase)); err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 1, true
	}
	return 3, true // the pause ended without reaching the step
}

func runCrashChild(step, dir, base string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	repo, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{})
	if err != nil {
		return err
	}
	d, err := qemu.New(qemu.Options{})
	if err != nil {
		return err
	}
	r, err := node.OpenRestorer(node.RestorerOptions{VMM: d, RuntimeDir: filepath.Join(dir, "run"), Mount: filepath.Join(dir, "crash-mnt")})
	if err != nil {
		return err
	}
	defer r.Close()
	res, err := repo.Resolve(ctx, base)
	if err != nil {
		return err
	}
	inst, err := r.Restorer.Restore(ctx, restore.SourceOf(res), restore.Options{Pausable: true})
	if err != nil {
		return err
	}
	defer inst.Stop(context.Background())
	if _, err := inst.VM().(vmm.StateAgent).WriteState(ctx, "crash", crashKiB, crashSeed); err != nil {
		return err
	}
	// then=resume: every step of a pause runs.
	_, err = pause.Run(ctx, repo, inst, pause.Request{}, pause.Options{
		StagingDir: filepath.Join(dir, "run"),
		OnStep: func(s string) {
			if s == step {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		},
	})
	return err
}

// TestPauseCrashAtEveryStep kills a pausing process at each step: after
// each kill the repository holds either no trace of the child or the
// whole child (killed after its record), which restores with the state
// its guest wrote; the parent restores as before, and the next pause
// succeeds.
func TestPauseCrashAtEveryStep(t *testing.T) {
	qemutest.RequireGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	g := sharedGuest(t, ctx)
	for _, step := range pause.Steps {
		before := recordIDs(t, ctx, g.dir)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envCrashStep+"="+step, envCrashDir+"="+g.dir, envCrashBase+"="+g.base)
		out, err := cmd.CombinedOutput()
		if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("step %s: crash child ended with %v, want SIGKILL:\n%s", step, err, out)
		}
		if err := fusedev.CleanStale(filepath.Join(g.dir, "crash-mnt")); err != nil {
			t.Fatalf("step %s: %v", step, err)
		}
		after := recordIDs(t, ctx, g.dir) // a fresh open sweeps what the crash left
		added := slices.DeleteFunc(after, func(id string) bool { return slices.Contains(before, id) })
		switch {
		case step == pause.StepEnd && len(added) == 1:
			// Killed after its record: the whole child, with the guest's state.
			inst := g.restore(t, ctx, added[0], false)
			checkState(t, ctx, stateAgent(t, inst), map[string]string{"crash": agentspec.StateDigest(crashKiB, crashSeed)})
			if err := inst.Stop(ctx); err != nil {
				t.Fatal(err)
			}
		case len(added) != 0:
			t.Fatalf("killed before step %s: records %v appeared, want none", step, added)
		}
		t.Logf("killed before step %s: %d new records", step, len(added))
	}
}

// recordIDs lists the records of the store a fresh open sees.
func recordIDs(t *testing.T, ctx context.Context, dir string) []string {
	t.Helper()
	repo, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := repo.List(ctx, repository.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	return ids
}
