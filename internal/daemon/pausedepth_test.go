package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/layers"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/snapcheck"
	"warmstart/internal/trace"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/replay"
)

// chainVMM is the replay VMM playing the trace and write stamp the test
// sets before each restore.
type chainVMM struct {
	trace atomic.Value // string
	stamp atomic.Uint64
}

func (v *chainVMM) set(trace string, stamp uint64) {
	v.trace.Store(trace)
	v.stamp.Store(stamp)
}

func (v *chainVMM) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	played := replay.VMM{TracePath: v.trace.Load().(string), WriteStamp: v.stamp.Load()}
	return played.Restore(ctx, spec)
}

// generationTrace is the reference trace with every fourth entry, from
// the k-th, a write and the others reads: generations 1 to 4 each write
// pages of their own (a merge that lost any layer shows).
func generationTrace(t *testing.T, dir string, ref []trace.Entry, k int) (path string, written []int64) {
	t.Helper()
	seen := map[int64]bool{}
	out := make([]trace.Entry, len(ref))
	for i, e := range ref {
		e.Write = i%4 == k%4
		if e.Write && !seen[e.Offset] {
			seen[e.Offset] = true
			written = append(written, e.Offset)
		}
		out[i] = e
	}
	path = filepath.Join(dir, fmt.Sprintf("gen%d.trace", k))
	if err := trace.WriteFile(path, out); err != nil {
		t.Fatal(err)
	}
	return path, written
}

// TestPausePastMaxDepthMerges: with [pause] max_depth = 3, a chain of
// pauses whose guests write different pages grows to depth 3; the fourth
// child would have 4 diff layers and is published with one over the base,
// merging the chain's three and its own: its memory equals the chain's
// with the new pages (every page compared), it verifies, its manifest is
// harvested from what its guest wrote, and the old chain still restores.
// A pause of it is a plain diff again (depth 2).
func TestPausePastMaxDepthMerges(t *testing.T) {
	c := newPauseChain(t, 3)
	f, r, vm, ref, mem, imp := c.f, c.r, c.vm, c.ref, c.mem, c.base
	ctx := context.Background()
	ids, mems, restores := []string{imp.ID}, [][]byte{bytes.Clone(mem)}, []string{""}
	for k := 1; k <= 5; k++ {
		g := c.pauseGeneration(t, ids[k-1], mems[k-1], k, uint64(0x1000+k))
		res, written := g.res, g.written
		wantDepth, flat := map[int]int{1: 1, 2: 2, 3: 3, 4: 1, 5: 2}[k], k == 4
		if res.Parent != ids[k-1] || res.Depth != wantDepth || res.Flattened != flat || res.Pages.Stored != int64(len(written)) {
			t.Fatalf("pause %d: %+v; want a child of %s at depth %d (flattened %t) storing %d written pages",
				k, res, ids[k-1], wantDepth, flat, len(written))
		}
		ids, mems, restores = append(ids, res.Snapshot), append(mems, g.mem), append(restores, g.in.ID)
	}
	vm.set(f.ref.Trace, 0) // restores from here only read

	repo, err := posixfs.Open(f.cfg.Backend.PosixFS.SnapshotStore, posixfs.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	for k := 1; k <= 5; k++ {
		samePages(t, repo, ids[k], mems[k])
		if rep, err := snapcheck.Verify(ctx, repo, ids[k], snapcheck.Options{}); err != nil || !rep.OK {
			t.Fatalf("verify child %d: %+v, %v", k, rep, err)
		}
	}
	flat, err := repo.Lookup(ctx, ids[4])
	if err != nil {
		t.Fatal(err)
	}
	if ls := flat.MemoryLayers; len(ls) != 2 || ls[0].Snapshot != imp.ID || ls[1].Snapshot != ids[4] || flat.Parent != ids[3] {
		t.Fatalf("flattened child's chain %+v, parent %s; want the base's layer and its own, parent %s", ls, flat.Parent, ids[3])
	}
	if h := flat.ManifestRecording; flat.Manifest == nil || h == nil || h.Harvested == nil || h.Harvested.FromRestore != restores[4] || h.Harvested.StartupPages == 0 {
		t.Fatalf("flattened child's recording %+v; want one harvested from restore %s's startup path", h, restores[4])
	}
	for _, k := range []int{3, 4} {
		file := filepath.Join(t.TempDir(), "mem")
		if err := os.WriteFile(file, mems[k], 0o600); err != nil {
			t.Fatal(err)
		}
		want, err := replay.ExpectedHash(file, ref, nil)
		if err != nil {
			t.Fatal(err)
		}
		in, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: ids[k]})
		if err != nil {
			t.Fatalf("restore child %d: %v", k, err)
		}
		if _, err := r.client.StopRestore(ctx, in.ID); err != nil {
			t.Fatal(err)
		}
		if in.Ready.SHA256 != want {
			t.Fatalf("restore of child %d read hash %s, want %s", k, in.Ready.SHA256, want)
		}
	}
}

// samePages reads snapshot id's whole memory and compares it with want,
// page by page.
func samePages(t *testing.T, repo repository.Repository, id string, want []byte) {
	t.Helper()
	res, err := repo.Resolve(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	low, err := res.Memory.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer low.Close()
	got := make([]byte, len(want))
	if _, err := low.ReadAt(got, 0); err != nil && err != io.EOF {
		t.Fatalf("read %s's memory: %v", id, err)
	}
	for p := 0; p < len(want); p += layers.PageBytes {
		if !bytes.Equal(got[p:p+layers.PageBytes], want[p:p+layers.PageBytes]) {
			t.Fatalf("snapshot %s: page %d differs from the chain's memory with the new pages", id, p/layers.PageBytes)
		}
	}
}
