package posixfs

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestLayerPublishCrashAtEveryFaultPoint kills a child publishing a layer
// with SIGKILL at each step, then checks that the child is wholly visible
// (crashed after its record) or not at all, that the parent has no
// dependent left but a visible child, that the open's sweep leaves
// nothing behind, and that a new child can be published.
func TestLayerPublishCrashAtEveryFaultPoint(t *testing.T) {
	t.Parallel()
	for _, point := range LayerFaultPoints {
		t.Run(point, func(t *testing.T) {
			store := filepath.Join(t.TempDir(), "store")
			r, err := Open(store, Options{})
			if err != nil {
				t.Fatal(err)
			}
			base := repotest.PublishBase(t, r, repotest.SmallMemoryBytes, "")
			built, mem := repotest.BuildLayer(t, base.Memory, repotest.Change{Pages: []int64{1, 5}, Zero: []int64{2}})
			vm := repotest.NewInputs(t, repotest.SmallMemoryBytes).VMStatePath
			env := repotest.LayerPublishEnv(base.Record.ID, built.Dir, vm)
			env[FaultPointEnv] = point
			c := repotest.StartChild(t, "publish-layer", store, env, nil)
			childID := c.Ready(t)
			if code, sig := c.Wait(t); sig != syscall.SIGKILL {
				t.Fatalf("child was not killed at %s: exit %d, stderr: %s", point, code, c.Stderr())
			}
			reader := &Repo{paths: r.paths}
			checkConsistent(t, reader)
			rec, err := reader.Get(bg(), childID)
			visible := point == FaultPublishAfterRecord
			if visible != (err == nil) || (err != nil && !errors.Is(err, repository.ErrNotFound)) {
				t.Fatalf("after a crash at %s Get = %+v, %v; want visible=%v", point, rec, err, visible)
			}
			reopened, err := Open(store, Options{})
			if err != nil {
				t.Fatal(err)
			}
			checkSwept(t, reopened)
			if markers, _ := filepath.Glob(filepath.Join(store, "catalog", "dependents", "*", "*")); len(markers) != map[bool]int{true: 1}[visible] {
				t.Fatalf("after a crash at %s and a sweep, markers %v are left", point, markers)
			}
			live, inProgress, err := reopened.Dependents(bg(), base.Record.ID)
			if err != nil || len(inProgress) != 0 || (len(live) == 1) != visible {
				t.Fatalf("after a crash at %s the parent's dependents are %v, %v (%v)", point, live, inProgress, err)
			}
			if visible {
				repotest.CheckLineage(t, reopened, repotest.Lineage{Record: rec, Memory: mem})
			}
			again := repotest.PublishChild(t, reopened, base, repotest.Change{Pages: []int64{3}}, "")
			repotest.CheckLineage(t, reopened, again)
			for _, id := range []string{again.Record.ID, childID, base.Record.ID} {
				if err := reopened.Delete(bg(), id); err != nil {
					t.Fatalf("delete %s: %v", id, err)
				}
			}
		})
	}
}
