package repotest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"warmstart/internal/layers"
	"warmstart/internal/manifest"
	"warmstart/internal/repository"
)

// RunLayers checks the layered-memory part of the contract
// (repository.Layers): paused children over a published snapshot, their
// chains as a restore reads them, and the lifetimes that keep every
// layer a child reads. open returns a fresh, empty repository each time.
func RunLayers(t *testing.T, open func(t *testing.T) repository.Repository) {
	tests := []struct {
		name string
		fn   func(*testing.T, repository.Repository)
	}{
		{"ChainOfChildrenReadsAsTheirMemory", testLayerChain},
		{"ChildWithoutOwnLayerTakesTheParents", testLayerInherited},
		{"MergedLayerReplacesTheDiffLayers", testLayerMerged},
		{"DeleteParentWithLiveChildren", testDeleteParentWithLiveChildren},
		{"PublishLayerRefusals", testPublishLayerRefused},
		{"ChildStoresOnlyWhatDiffers", testChildStorage},
		{"LayerOfZeroPagesOnly", testZeroLayer},
		{"ReplaceMemoryFlattensInPlace", testReplaceMemory},
		{"ChildOverAParentFlattenedSinceItWasRead", testPublishOverFlattened},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

// Lineage is a published snapshot with the memory it must serve.
type Lineage struct {
	Record repository.Record
	Memory []byte
}

// PublishBase publishes fresh inputs of memBytes and returns them as a
// lineage root.
func PublishBase(t testing.TB, repo repository.Repository, memBytes int64, alias string) Lineage {
	t.Helper()
	in := NewInputs(t, memBytes)
	rec, lease := PublishInputs(t, repo, in, alias)
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	mem, err := os.ReadFile(in.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	return Lineage{Record: rec, Memory: mem}
}

// Change says what a pause changes: every page whose index is in Pages
// gets new random bytes, in Zero all zeros, in Same its old bytes again
// (reported dirty, not changed).
type Change struct {
	Pages, Zero, Same []int64
}

// RandomChange picks n pages to change, n/4 to zero and n/4 unchanged
// among pages.
func RandomChange(rng *rand.Rand, pages int64, n int) Change {
	perm := rng.Perm(int(pages))
	var c Change
	for i, p := range perm[:min(int(pages), n+n/2)] {
		switch {
		case i < n:
			c.Pages = append(c.Pages, int64(p))
		case i < n+n/4:
			c.Zero = append(c.Zero, int64(p))
		default:
			c.Same = append(c.Same, int64(p))
		}
	}
	return c
}

// memoryDigests answers a builder's parent digests from a model memory.
type memoryDigests []byte

func (m memoryDigests) PageSHA256(page int64) ([32]byte, bool) {
	off := page * layers.PageBytes
	if off < 0 || off+layers.PageBytes > int64(len(m)) {
		return [32]byte{}, false
	}
	return sha256.Sum256(m[off : off+layers.PageBytes]), true
}

// BuildLayer builds the layer of change over parent's memory in a fresh
// directory and returns it with the child's memory.
func BuildLayer(t testing.TB, parent []byte, change Change) (*layers.Built, []byte) {
	t.Helper()
	child := bytes.Clone(parent)
	pages := map[int64][]byte{}
	for _, p := range change.Pages {
		pages[p] = randomPage(t)
	}
	for _, p := range change.Zero {
		pages[p] = make([]byte, layers.PageBytes)
	}
	for _, p := range change.Same {
		pages[p] = bytes.Clone(parent[p*layers.PageBytes : (p+1)*layers.PageBytes])
	}
	b, err := layers.NewBuilder(t.TempDir(), int64(len(parent)), memoryDigests(parent))
	if err != nil {
		t.Fatal(err)
	}
	order := make([]int64, 0, len(pages))
	for p := range pages {
		order = append(order, p)
	}
	slices.Sort(order)
	for _, p := range order {
		if err := b.Add(p, pages[p]); err != nil {
			t.Fatal(err)
		}
		copy(child[p*layers.PageBytes:], pages[p])
	}
	built, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return built, child
}

func randomPage(t testing.TB) []byte {
	p := make([]byte, layers.PageBytes)
	for i := 0; i < len(p); i += 8 {
		v := rand.Uint64()
		for k := range 8 {
			p[i+k] = byte(v >> (8 * k))
		}
	}
	return p
}

// LayerRequest is a publish request of built over parent with a fresh VM
// state file and a small manifest.
func LayerRequest(t testing.TB, parent repository.Record, built *layers.Built, alias string) repository.LayerPublishRequest {
	t.Helper()
	vm := filepath.Join(t.TempDir(), "vm_state.bin")
	writeRandom(t, vm, VMStateBytes)
	m, err := manifest.Build(parent.Layout, []int64{0, 2 * layers.PageBytes})
	if err != nil {
		t.Fatal(err)
	}
	data, err := manifest.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return repository.LayerPublishRequest{Parent: parent, VMStatePath: vm, Layer: built, Alias: alias,
		Manifest: data, Recording: &repository.Recording{Harvested: &repository.Harvest{FromRestore: "r1", StartupPages: 2}}}
}

// PublishChild pauses parent into a child with change and checks what
// the repository returns; the lease has ended when it returns.
func PublishChild(t testing.TB, repo repository.Repository, parent Lineage, change Change, alias string) Lineage {
	t.Helper()
	built, mem := BuildLayer(t, parent.Memory, change)
	rec := PublishLayer(t, repo, LayerRequest(t, parent.Record, built, alias))
	return Lineage{Record: rec, Memory: mem}
}

// PublishLayer publishes req under a new lease, which has ended when it
// returns.
func PublishLayer(t testing.TB, repo repository.Repository, req repository.LayerPublishRequest) repository.Record {
	t.Helper()
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	rec, err := repo.PublishLayer(bg(), lease, req)
	if err != nil {
		t.Fatalf("PublishLayer over %s: %v", req.Parent.ID, err)
	}
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	return rec
}

// CheckLineage checks that l's snapshot reads back as its record and
// resolves to its memory.
func CheckLineage(t testing.TB, repo repository.Repository, l Lineage) {
	t.Helper()
	got, err := repo.Get(bg(), l.Record.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.MemoryIdentity() != l.Record.MemoryIdentity() || got.Parent != l.Record.Parent {
		t.Fatalf("Get(%s) = %+v, want %+v", l.Record.ID, got, l.Record)
	}
	res, err := repo.Resolve(bg(), l.Record.ID)
	if err != nil {
		t.Fatalf("Resolve(%s): %v", l.Record.ID, err)
	}
	if sum := ResolvedMemorySHA256(t, res); sum != SHA256Hex(l.Memory) {
		t.Fatalf("snapshot %s (depth %d) serves memory %s, want %s", l.Record.ID, l.Record.Depth(), sum, SHA256Hex(l.Memory))
	}
}

func testLayerChain(t *testing.T, repo repository.Repository) {
	rng := rand.New(rand.NewPCG(1, 2))
	cur := PublishBase(t, repo, SmallMemoryBytes, "base")
	pages := int64(SmallMemoryBytes / layers.PageBytes)
	for depth := 1; depth <= 4; depth++ {
		next := PublishChild(t, repo, cur, RandomChange(rng, pages, 3), "")
		r := next.Record
		if r.Depth() != depth || r.Parent != cur.Record.ID || r.Format != repository.RecordFormatLayered ||
			r.MemoryLayers[depth].Snapshot != r.ID || r.Manifest == nil || r.ManifestRecording.Harvested == nil {
			t.Fatalf("child at depth %d: %+v", depth, r)
		}
		CheckLineage(t, repo, next)
		CheckLineage(t, repo, cur)
		cur = next
	}
	all := mustList(t, repo, repository.Filter{})
	if len(all) != 5 {
		t.Fatalf("List has %d records, want the base and 4 children", len(all))
	}
}

func testLayerInherited(t *testing.T, repo repository.Repository) {
	base := PublishBase(t, repo, SmallMemoryBytes, "")
	child := PublishChild(t, repo, base, Change{Pages: []int64{1}}, "")
	req := LayerRequest(t, child.Record, nil, "same")
	rec := PublishLayer(t, repo, req)
	if rec.Depth() != 1 || rec.MemoryLayers[1].Snapshot != child.Record.ID || rec.Parent != child.Record.ID || rec.Alias != "same" {
		t.Fatalf("child without a layer of its own: %+v", rec)
	}
	CheckLineage(t, repo, Lineage{Record: rec, Memory: child.Memory})
	// Over a plain parent, a child without a layer names the parent's memory.
	plain := PublishLayer(t, repo, LayerRequest(t, base.Record, nil, ""))
	if plain.Depth() != 0 || plain.MemoryLayers[0].Snapshot != base.Record.ID {
		t.Fatalf("child of a plain parent without a layer: %+v", plain)
	}
	CheckLineage(t, repo, Lineage{Record: plain, Memory: base.Memory})
}

func testLayerMerged(t *testing.T, repo repository.Repository) {
	base := PublishBase(t, repo, SmallMemoryBytes, "")
	a := PublishChild(t, repo, base, Change{Pages: []int64{1, 2, 3}, Zero: []int64{4}}, "")
	b := PublishChild(t, repo, a, Change{Pages: []int64{3, 5}, Zero: []int64{1}}, "")
	// Merge b's chain with one more diff, as a pause at the depth bound does.
	_, mem := BuildLayer(t, b.Memory, Change{Pages: []int64{7}})
	merged, err := layers.NewBuilder(t.TempDir(), int64(len(base.Memory)), memoryDigests(base.Memory))
	if err != nil {
		t.Fatal(err)
	}
	for p := range int64(len(mem) / layers.PageBytes) {
		if err := merged.Add(p, mem[p*layers.PageBytes:(p+1)*layers.PageBytes]); err != nil {
			t.Fatal(err)
		}
	}
	built, err := merged.Finish()
	if err != nil {
		t.Fatal(err)
	}
	req := LayerRequest(t, b.Record, built, "")
	req.Merged = true
	rec := PublishLayer(t, repo, req)
	if rec.Depth() != 1 || rec.Parent != b.Record.ID || rec.MemoryLayers[0].Snapshot != base.Record.ID || rec.MemoryLayers[1].Snapshot != rec.ID {
		t.Fatalf("merged child: %+v", rec)
	}
	CheckLineage(t, repo, Lineage{Record: rec, Memory: mem})
	// It depends on the base only: a and b go, the base stays.
	for _, id := range []string{b.Record.ID, a.Record.ID} {
		if err := repo.Delete(bg(), id); err != nil {
			t.Fatalf("delete %s under a merged child: %v", id, err)
		}
	}
	CheckLineage(t, repo, Lineage{Record: rec, Memory: mem})
	wantDependents(t, repo, base.Record.ID, rec.ID)
}

func wantDependents(t testing.TB, repo repository.Repository, id string, want ...string) {
	t.Helper()
	live, inProgress, err := repo.Dependents(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(live)
	slices.Sort(want)
	if !slices.Equal(live, want) || len(inProgress) != 0 {
		t.Fatalf("Dependents(%s) = %v, %v; want %v", id, live, inProgress, want)
	}
}

func testDeleteParentWithLiveChildren(t *testing.T, repo repository.Repository) {
	base := PublishBase(t, repo, SmallMemoryBytes, "base")
	child := PublishChild(t, repo, base, Change{Pages: []int64{0}}, "child")
	grand := PublishChild(t, repo, child, Change{Pages: []int64{2}}, "")
	wantDependents(t, repo, base.Record.ID, child.Record.ID, grand.Record.ID)
	wantDependents(t, repo, child.Record.ID, grand.Record.ID)
	wantDependents(t, repo, grand.Record.ID)

	err := repo.Delete(bg(), base.Record.ID)
	var de *repository.DependentsError
	if !errors.As(err, &de) || !errors.Is(err, repository.ErrHasDependents) {
		t.Fatalf("delete of a parent with live children = %v, want a DependentsError", err)
	}
	slices.Sort(de.Dependents)
	want := []string{child.Record.ID, grand.Record.ID}
	slices.Sort(want)
	if !slices.Equal(de.Dependents, want) {
		t.Fatalf("refusal names %v, want %v", de.Dependents, want)
	}
	CheckLineage(t, repo, base)
	CheckLineage(t, repo, grand)
	if err := repo.Delete(bg(), child.Record.ID); !errors.Is(err, repository.ErrHasDependents) {
		t.Fatalf("delete of the middle of a chain = %v, want ErrHasDependents", err)
	}
	for _, id := range []string{grand.Record.ID, child.Record.ID, base.Record.ID} {
		if err := repo.Delete(bg(), id); err != nil {
			t.Fatalf("delete %s leaf first: %v", id, err)
		}
	}
	if all := mustList(t, repo, repository.Filter{}); len(all) != 0 {
		t.Fatalf("after deleting the chain List has %d records", len(all))
	}
}

func testPublishLayerRefused(t *testing.T, repo repository.Repository) {
	base := PublishBase(t, repo, SmallMemoryBytes, "taken")
	built, _ := BuildLayer(t, base.Memory, Change{Pages: []int64{1}})
	try := func(req repository.LayerPublishRequest) error {
		lease, err := repo.BeginCapture(bg())
		if err != nil {
			t.Fatal(err)
		}
		defer lease.End()
		_, err = repo.PublishLayer(bg(), lease, req)
		return err
	}
	wantErr(t, "alias taken", try(LayerRequest(t, base.Record, built, "taken")), repository.ErrAliasConflict)
	other := PublishBase(t, repo, 2*SmallMemoryBytes, "")
	wantErr(t, "layer of another memory", try(LayerRequest(t, other.Record, built, "")), repository.ErrInvalidRequest)
	noVM := LayerRequest(t, base.Record, built, "")
	noVM.VMStatePath = ""
	wantErr(t, "no vm state", try(noVM), repository.ErrInvalidRequest)
	merged := LayerRequest(t, base.Record, nil, "")
	merged.Merged = true
	wantErr(t, "merged without a layer", try(merged), repository.ErrInvalidRequest)
	if err := repo.Delete(bg(), other.Record.ID); err != nil {
		t.Fatal(err)
	}
	built2, _ := BuildLayer(t, other.Memory, Change{Pages: []int64{1}})
	wantErr(t, "parent deleted", try(LayerRequest(t, other.Record, built2, "")), repository.ErrNotFound)
	if all := mustList(t, repo, repository.Filter{}); len(all) != 1 {
		t.Fatalf("refused publishes left %d records, want the base alone", len(all))
	}
	wantDependents(t, repo, base.Record.ID)
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	_, err = repo.PublishLayer(bg(), lease, LayerRequest(t, base.Record, built, ""))
	wantErr(t, "lease ended", err, repository.ErrLeaseEnded)
}

// testChildStorage checks the goal on storage: a child's own layer holds
// the pages that differ (no identical page, no zero page), its tables add
// less than a tenth, and nothing of its ancestors is copied.
func testChildStorage(t *testing.T, repo repository.Repository) {
	base := PublishBase(t, repo, SmallMemoryBytes, "")
	change := Change{Pages: []int64{1, 2, 3, 9}, Zero: []int64{5}, Same: []int64{6, 7}}
	child := PublishChild(t, repo, base, change, "")
	own := child.Record.MemoryLayers[1]
	differing := int64(len(change.Pages)) * layers.PageBytes
	if own.Size != differing || own.PageMap.DataPages != 4 || own.PageMap.ZeroPages != 1 {
		t.Fatalf("own layer %+v, want %d bytes of 4 data pages and 1 zero page", own, differing)
	}
	if extra := own.PageMap.Size + own.Digests.Size + own.SHA256Digests.Size; float64(extra) > 0.1*float64(differing)+200 {
		t.Fatalf("page map and tables add %d bytes to %d", extra, differing)
	}
}

// testZeroLayer: a child whose differing pages are all zero has a layer
// without data, which reads back as zeros over its parent.
func testZeroLayer(t *testing.T, repo repository.Repository) {
	base := PublishBase(t, repo, SmallMemoryBytes, "")
	child := PublishChild(t, repo, base, Change{Zero: []int64{0, 1, 7}}, "")
	own := child.Record.MemoryLayers[1]
	if own.Size != 0 || own.PageMap.ZeroPages != 3 || own.PageMap.DataPages != 0 {
		t.Fatalf("zero-only layer: %+v", own)
	}
	CheckLineage(t, repo, child)
	grand := PublishChild(t, repo, child, Change{Pages: []int64{1}}, "")
	CheckLineage(t, repo, grand)
}

// differing lists the pages where b differs from a.
func differing(a, b []byte) []int64 {
	var out []int64
	for p := int64(0); p*layers.PageBytes < int64(len(a)); p++ {
		lo, hi := p*layers.PageBytes, (p+1)*layers.PageBytes
		if !bytes.Equal(a[lo:hi], b[lo:hi]) {
			out = append(out, p)
		}
	}
	return out
}

// mergedOver builds one layer over base holding every page where l's
// memory differs from base's, with l's bytes.
func mergedOver(t *testing.T, base, l Lineage) *layers.Built {
	t.Helper()
	b, err := layers.NewBuilder(t.TempDir(), int64(len(base.Memory)), memoryDigests(base.Memory))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range differing(base.Memory, l.Memory) {
		if err := b.Add(p, l.Memory[p*layers.PageBytes:(p+1)*layers.PageBytes]); err != nil {
			t.Fatal(err)
		}
	}
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// memoryFile writes mem to a fresh file and returns its path.
func memoryFile(t *testing.T, mem []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "memory")
	if err := os.WriteFile(path, mem, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// replaceMemory runs ReplaceMemory under a lease of its own.
func replaceMemory(t *testing.T, repo repository.Repository, req repository.ReplaceMemoryRequest) (repository.Record, error) {
	t.Helper()
	lease, err := repo.LeaseExisting(bg(), req.Expect.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	return repo.ReplaceMemory(bg(), lease, req)
}

// testReplaceMemory flattens a depth-2 leaf in place: refused while a
// child depends on it and when its memory changed since it was read; a
// merged layer over the base, then a whole memory file, each reading back
// as the leaf's memory, after which every ancestor can be deleted.
func testReplaceMemory(t *testing.T, repo repository.Repository) {
	base := PublishBase(t, repo, SmallMemoryBytes, "")
	a := PublishChild(t, repo, base, Change{Pages: []int64{1, 2}, Zero: []int64{3}}, "")
	b := PublishChild(t, repo, a, Change{Pages: []int64{2, 9}}, "")
	_, err := replaceMemory(t, repo, repository.ReplaceMemoryRequest{Expect: a.Record, MemoryPath: memoryFile(t, a.Memory)})
	wantErr(t, "flatten of a parent", err, repository.ErrHasDependents)
	stale := b.Record
	stale.MemoryLayers = stale.MemoryLayers[:2]
	_, err = replaceMemory(t, repo, repository.ReplaceMemoryRequest{Expect: stale, Layer: mergedOver(t, base, b)})
	wantErr(t, "flatten of changed memory", err, repository.ErrStale)

	rec, err := replaceMemory(t, repo, repository.ReplaceMemoryRequest{Expect: b.Record, Layer: mergedOver(t, base, b)})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Depth() != 1 || rec.ID != b.Record.ID || rec.Parent != a.Record.ID || rec.MemoryLayers[0].Snapshot != base.Record.ID {
		t.Fatalf("merged: %+v", rec)
	}
	CheckLineage(t, repo, Lineage{Record: rec, Memory: b.Memory})
	wantDependents(t, repo, a.Record.ID)
	rec, err = replaceMemory(t, repo, repository.ReplaceMemoryRequest{Expect: rec, MemoryPath: memoryFile(t, b.Memory)})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Layered() || rec.MemorySHA256 != SHA256Hex(b.Memory) || rec.Parent != a.Record.ID {
		t.Fatalf("full: %+v", rec)
	}
	for _, id := range []string{a.Record.ID, base.Record.ID} {
		if err := repo.Delete(bg(), id); err != nil {
			t.Fatalf("delete ancestor %s after a full flatten: %v", id, err)
		}
	}
	CheckLineage(t, repo, Lineage{Record: rec, Memory: b.Memory})
}

// testPublishOverFlattened: a child built over its parent's record (a
// pause reads it before it freezes the VM) is published after the parent
// was flattened in place, which retired the layer the child would name.
// The publish is refused as stale and leaves nothing; built again over
// the parent's new record, the child reads back as its memory.
func testPublishOverFlattened(t *testing.T, repo repository.Repository) {
	base := PublishBase(t, repo, SmallMemoryBytes, "")
	a := PublishChild(t, repo, base, Change{Pages: []int64{1, 2}}, "")
	b := PublishChild(t, repo, a, Change{Pages: []int64{2, 9}}, "")
	built, mem := BuildLayer(t, b.Memory, Change{Pages: []int64{4}})
	req := LayerRequest(t, b.Record, built, "")
	flat, err := replaceMemory(t, repo, repository.ReplaceMemoryRequest{Expect: b.Record, MemoryPath: memoryFile(t, b.Memory)})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	if rec, err := repo.PublishLayer(bg(), lease, req); !errors.Is(err, repository.ErrStale) {
		t.Fatalf("a child naming the flattened parent's retired layer: %s (layers %d), %v; want ErrStale", rec.ID, len(rec.MemoryLayers), err)
	}
	if _, err := repo.Get(bg(), lease.SnapshotID()); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("the refused child: %v, want not found", err)
	}
	child := PublishLayer(t, repo, LayerRequest(t, flat, built, ""))
	CheckLineage(t, repo, Lineage{Record: child, Memory: mem})
	wantDependents(t, repo, b.Record.ID, child.ID)
}
