package daemon_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/pause"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/replay"
)

// stampedVMM is the replay VMM with a write stamp the test switches.
type stampedVMM struct {
	trace string
	stamp atomic.Uint64
}

func (v *stampedVMM) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	played := replay.VMM{TracePath: v.trace, WriteStamp: v.stamp.Load()}
	return played.Restore(ctx, spec)
}

// TestPauseEndpointPublishesChildren: a restore started pausable, whose
// guest writes stamped pages, is paused through the API: a pause that
// fails at publish keeps the pages for the next, which publishes a child
// holding them all (the VM runs on), then again into a child of the child with nothing changed
// (it takes its parent's layers) and stopped; a restore of the first child
// reads exactly the parent's memory with the stamped pages.
func TestPauseEndpointPublishesChildren(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	const stamp = 0x5eed
	vm := &stampedVMM{trace: f.ref.Trace}
	vm.stamp.Store(stamp)
	// The first pause to reach publish finds its alias taken meanwhile.
	var r *running
	onFirstPauseAt(t, pause.StepPublish, func() {
		if _, err := r.client.Import(context.Background(), f.importRequest("late")); err != nil {
			t.Error(err)
		}
	})
	r = startDaemon(t, f, func(o *daemon.Options) { o.VMM = vm })
	ctx := context.Background()
	imp := r.importAs(t, f, "base")
	in, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: imp.ID, Pausable: true})
	if err != nil {
		t.Fatal(err)
	}
	entries, written := tracedWrites(t, f.ref.Trace)
	if len(written) == 0 {
		t.Fatal("the reference trace writes no page")
	}

	// A pause that fails after the VMM saved its changed pages (its alias
	// was taken while it built the layer) publishes nothing, and the next
	// pause still has them all.
	_, err = r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "late"})
	wantStatus(t, "a pause whose alias was taken before its publish", err, "late", 409)
	first, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid"})
	if err != nil {
		t.Fatal(err)
	}
	if first.Parent != imp.ID || first.Depth != 1 || first.Alias != "kid" || first.Pages.Stored != int64(len(written)) || first.Stop != nil {
		t.Fatalf("first pause: %+v; want a child of %s at depth 1 aliased kid storing the %d written pages, still running", first, imp.ID, len(written))
	}
	second, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Then: api.ThenStop})
	if err != nil {
		t.Fatal(err)
	}
	if second.Parent != first.Snapshot || second.Depth != 1 || second.Pages.Candidates != 0 || second.Stop == nil {
		t.Fatalf("second pause: %+v; want a child of %s sharing its layers, nothing changed, stopped", second, first.Snapshot)
	}
	var ae *api.APIError
	if _, err := r.client.Pause(ctx, in.ID, api.PauseRequest{}); !errors.As(err, &ae) || ae.StatusCode != 404 {
		t.Fatalf("pause of a stopped restore: %v, want 404", err)
	}

	vm.stamp.Store(0) // the child's restore reads, and changes nothing
	want, err := replay.ExpectedHash(stampedMemory(t, f.ref.Memory, written, stamp), entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"kid", second.Snapshot} {
		restoreReadsHash(t, r, id, want)
	}
}

// stampedMemory is a copy of mem with each written page stamped as the
// replay VMM stamps it.
func stampedMemory(t *testing.T, mem string, written map[int64]bool, stamp uint64) string {
	t.Helper()
	data, err := os.ReadFile(mem)
	if err != nil {
		t.Fatal(err)
	}
	for off := range written {
		binary.LittleEndian.PutUint64(data[off:], replay.StampOf(stamp, off))
	}
	out := filepath.Join(t.TempDir(), "stamped")
	if err := os.WriteFile(out, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}
