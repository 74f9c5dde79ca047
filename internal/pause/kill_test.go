package pause_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
	"warmstart/internal/vmm/qemu/qemutest"

	"warmstart/internal/agentspec"
	"warmstart/internal/pause"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
)

// TestQEMUKilledDuringAPause: the real QEMU guest is killed (SIGKILL) at
// a step of a pause: before it is paused, as it runs again after its
// state was saved (then=resume), and before the publish (then=stop).
// A pause that fails names the exited VM and leaves no record; one that
// publishes (the state was saved whole) leaves a child that restores
// with the state the guest wrote. Either way no staging is left and the
// restore stops cleanly, its QEMU gone.
func TestQEMUKilledDuringAPause(t *testing.T) {
	qemutest.RequireGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	g := sharedGuest(t, ctx)
	for _, tc := range []struct {
		step string
		stop bool
	}{{pause.StepPause, false}, {pause.StepResume, false}, {pause.StepPublish, true}} {
		t.Run(tc.step, func(t *testing.T) {
			before := recordIDs(t, ctx, g.dir)
			// Pauses killed by other tests of the shared guest leave theirs.
			staged := filepath.Join(g.run, pause.StagingPrefix+"*")
			stagedBefore, _ := filepath.Glob(staged)
			inst := g.restore(t, ctx, g.base, true)
			const kib, seed = 1 << 10, 31
			if _, err := stateAgent(t, inst).WriteState(ctx, "killed", kib, seed); err != nil {
				t.Fatal(err)
			}
			pid := inst.VM().(vmm.Process).PID()
			killed := false
			res, err := pause.Run(ctx, g.repo, inst, pause.Request{Stop: tc.stop}, pause.Options{
				StagingDir: g.run,
				OnStep: func(s string) {
					if s == tc.step && !killed {
						killed = true
						if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
							t.Errorf("kill QEMU %d: %v", pid, err)
						}
					}
				},
			})
			if !killed {
				t.Fatalf("the pause never reached step %s", tc.step)
			}
			added := slices.DeleteFunc(recordIDs(t, ctx, g.dir), func(id string) bool { return slices.Contains(before, id) })
			switch {
			case err != nil:
				t.Logf("killed before step %s: %v", tc.step, err)
				if !errors.Is(err, restore.ErrVMExited) {
					t.Errorf("the pause's error does not name the exited VM: %v", err)
				}
				if len(added) != 0 {
					t.Errorf("a failed pause left records %v", added)
				}
			case len(added) != 1 || added[0] != res.Child.ID:
				t.Errorf("the pause published %s, the store gained %v", res.Child.ID, added)
			default:
				t.Logf("killed before step %s: published %s", tc.step, res.Child.ID)
			}
			left, _ := filepath.Glob(staged)
			if left = slices.DeleteFunc(left, func(p string) bool { return slices.Contains(stagedBefore, p) }); len(left) != 0 {
				t.Errorf("staging left: %v", left)
			}
			stopErr := inst.Stop(ctx)
			t.Logf("stop after the kill: %v", stopErr)
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("QEMU %d still there after the stop: %v", pid, err)
			}
			if err == nil {
				c := g.restore(t, ctx, res.Child.ID, false)
				checkState(t, ctx, stateAgent(t, c), map[string]string{"killed": agentspec.StateDigest(kib, seed)})
				if err := c.Stop(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
