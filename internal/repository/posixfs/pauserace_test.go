package posixfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestPublishLayerRacingSweepDeleteFlatten: at each fault point of a
// child's layer publish, another opening of the store (as another
// process's) sweeps it, tries to delete the parent and to flatten it
// whole. From the child's markers on, the delete and the flatten are
// refused and the sweep takes nothing the publish needs: the child is
// committed and reads back as its memory, and the parent stays.
func TestPublishLayerRacingSweepDeleteFlatten(t *testing.T) {
	for _, point := range LayerFaultPoints {
		t.Run(point, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			a, err := Open(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			b, err := Open(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			base := repotest.PublishBase(t, a, repotest.SmallMemoryBytes, "")
			mid := repotest.PublishChild(t, a, base, repotest.Change{Pages: []int64{1, 3}}, "")
			memPath := filepath.Join(t.TempDir(), "mid.mem")
			if err := os.WriteFile(memPath, mid.Memory, 0o600); err != nil {
				t.Fatal(err)
			}
			var sweepErr, delErr, flatErr error
			tried := false
			a.faultHook = func(p string) {
				if p != point || tried {
					return
				}
				tried = true
				sweepErr = b.Sweep(bg())
				delErr = b.Delete(bg(), mid.Record.ID)
				lease, err := b.LeaseExisting(bg(), mid.Record.ID)
				if err != nil {
					flatErr = err
					return
				}
				defer lease.End()
				_, flatErr = b.ReplaceMemory(bg(), lease, repository.ReplaceMemoryRequest{Expect: mid.Record, MemoryPath: memPath})
			}
			child := repotest.PublishChild(t, a, mid, repotest.Change{Pages: []int64{2, 3}}, "")
			if !tried {
				t.Fatalf("fault point %s not reached", point)
			}
			if sweepErr != nil {
				t.Errorf("sweep during the publish: %v", sweepErr)
			}
			if !errors.Is(delErr, repository.ErrHasDependents) {
				t.Errorf("delete of the parent at %s: %v, want it refused", point, delErr)
			}
			if !errors.Is(flatErr, repository.ErrHasDependents) {
				t.Errorf("flatten of the parent at %s: %v, want it refused", point, flatErr)
			}
			fresh, err := Open(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			repotest.CheckLineage(t, fresh, child)
			repotest.CheckLineage(t, fresh, mid)
		})
	}
}
