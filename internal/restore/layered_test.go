package restore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/layers"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
)

// publishRestatingChild publishes a child of the env's snapshot whose own
// layer holds every other page of the touched set with the bytes they
// already have (built without parent digests, so nothing is dropped): the
// child serves the reference's bytes, half of the touched pages from its
// layer, so a restore reads through the chain on every path.
func (e *env) publishRestatingChild(t *testing.T) (repository.Record, int64) {
	t.Helper()
	ctx := context.Background()
	parent, err := e.repo.Get(ctx, e.id)
	must(t, err)
	mem, err := os.ReadFile(e.ref.paths.Memory)
	must(t, err)
	pages := map[int64]bool{}
	for i, en := range e.ref.entries {
		if i%2 == 0 {
			pages[en.Offset/layers.PageBytes] = true
		}
	}
	b, err := layers.NewBuilder(t.TempDir(), int64(len(mem)), nil)
	must(t, err)
	var inLayer int64 = -1
	for p := range int64(len(mem)) / layers.PageBytes {
		if pages[p] {
			must(t, b.Add(p, mem[p*layers.PageBytes:(p+1)*layers.PageBytes]))
			if inLayer < 0 && isNonZero(t, e, p*layers.PageBytes) {
				inLayer = p * layers.PageBytes
			}
		}
	}
	built, err := b.Finish()
	must(t, err)
	req := repotest.LayerRequest(t, parent, built, "")
	req.VMStatePath, req.Manifest, req.Recording = e.ref.paths.VMState, nil, nil
	return repotest.PublishLayer(t, e.repo, req), inLayer
}

// A paused child restores through its chain on both devices, with and
// without prefetch, and serves exactly its memory.
func TestLayeredChildRestores(t *testing.T) {
	e := newEnv(t, envOptions{noManifest: true})
	child, _ := e.publishRestatingChild(t)
	e.id = child.ID
	for _, device := range devices {
		for _, mode := range []restore.Mode{restore.ModeOn, restore.ModeOff} {
			inst, err := e.resolveAndRestore(device, mode)
			if err != nil {
				t.Fatalf("%s/%s: restore of a depth-1 child: %v", device, mode, err)
			}
			checkHash(t, inst, e.ref.expected)
			stop(t, inst)
		}
	}
}

// A flipped byte in a page of the child's own layer that the guest reads
// fails the restore with an integrity error on both devices: each layer
// is checked against its own table.
func TestLayeredChildCorruptLayerRefused(t *testing.T) {
	e := newEnv(t, envOptions{noManifest: true})
	child, logical := e.publishRestatingChild(t)
	e.id = child.ID
	own := child.MemoryLayers[1]
	data := filepath.Join(e.repo.Root(), "snapshots", child.ID, repository.LayerDataFile(own.Name))
	res, err := e.repo.Resolve(context.Background(), child.ID)
	must(t, err)
	layer, slot, zero := res.Memory.(*repository.ChainSource).Chain().Locate(logical / layers.PageBytes)
	if layer != 1 || zero {
		t.Fatalf("page %d is served by layer %d (zero %v), want the child's own", logical, layer, zero)
	}
	backup, putBack := setAside(t, data)
	defer putBack()
	copyFile(t, backup, data)
	repotest.FlipBytes(t, data, slot*layers.PageBytes+5)
	for _, device := range devices {
		_, err := e.resolveAndRestore(device, restore.ModeOff)
		if !errors.Is(err, repository.ErrIntegrity) || !strings.Contains(err.Error(), child.ID) {
			t.Fatalf("%s: restore over a corrupt layer = %v, want an integrity error naming %s", device, err, child.ID)
		}
	}
}
