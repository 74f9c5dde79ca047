package repository

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"warmstart/internal/integrity"
	"warmstart/internal/layers"
)

const childID = "0192d3a4-5b6c-7d8e-9f00-112233445577"

func tables(size int64) (*DigestsDescriptor, *DigestsDescriptor) {
	return &DigestsDescriptor{Algorithm: string(integrity.CRC32C), BlockBytes: integrity.BlockBytes,
			SHA256: strings.Repeat("1", 64), Size: integrity.EncodedSize(integrity.CRC32C, size)},
		&DigestsDescriptor{Algorithm: string(integrity.SHA256), BlockBytes: integrity.BlockBytes,
			SHA256: strings.Repeat("2", 64), Size: integrity.EncodedSize(integrity.SHA256, size)}
}

// layeredRecord is a valid child of coreRecord with one diff layer.
func layeredRecord() Record {
	parent := coreRecord()
	r := parent
	r.ID, r.Alias, r.Format, r.Parent = childID, "", RecordFormatLayered, parent.ID
	r.MemorySHA256, r.MemoryDigests, r.MemorySHA256Digests, r.MemoryChunks = "", nil, nil, nil
	r.MemoryFormat = MemoryFormatLayers
	crc, strong := tables(3 * 4096)
	sum := strings.Repeat("e", 64)
	r.MemoryLayers = []LayerDescriptor{BaseLayerOf(parent), {Snapshot: childID, Name: layers.LayerName(sum), Kind: LayerDiff,
		Size: 3 * 4096, SHA256: sum, Format: LayerRaw, Digests: crc, SHA256Digests: strong,
		PageMap: &PageMapDescriptor{SHA256: strings.Repeat("f", 64), Size: 40 + 2*16, DataPages: 3, ZeroPages: 1}}}
	return r
}

func TestLayeredRecordValidate(t *testing.T) {
	if err := layeredRecord().Validate(); err != nil {
		t.Fatalf("valid layered record: %v", err)
	}
	if d := layeredRecord().Depth(); d != 1 {
		t.Fatalf("depth %d, want 1", d)
	}
	if o := layeredRecord().Owners(); len(o) != 1 || o[0] != coreRecord().ID {
		t.Fatalf("owners %v", o)
	}
	breaks := map[string]func(*Record){
		"format 2":               func(r *Record) { r.Format = RecordFormatVersion },
		"memory sha256 set":      func(r *Record) { r.MemorySHA256 = strings.Repeat("b", 64) },
		"no layers":              func(r *Record) { r.MemoryLayers = nil },
		"base not full":          func(r *Record) { r.MemoryLayers[0].Kind = LayerDiff },
		"base of another size":   func(r *Record) { r.MemoryLayers[0].Size = 4096 },
		"diff without page map":  func(r *Record) { r.MemoryLayers[1].PageMap = nil },
		"diff misnamed":          func(r *Record) { r.MemoryLayers[1].Name = "layer-0000000000000000" },
		"size not data pages":    func(r *Record) { r.MemoryLayers[1].PageMap.DataPages = 2 },
		"no sha256 table":        func(r *Record) { r.MemoryLayers[1].SHA256Digests = nil },
		"table of another size":  func(r *Record) { r.MemoryLayers[1].Digests.Size = 4 },
		"own layer not on top":   func(r *Record) { r.MemoryLayers[0].Snapshot = childID },
		"chunks for raw":         func(r *Record) { r.MemoryLayers[1].Chunks = &ChunkMapDescriptor{} },
		"bad owner":              func(r *Record) { r.MemoryLayers[1].Snapshot = "x" },
		"bad parent":             func(r *Record) { r.Parent = "x" },
		"page map too large":     func(r *Record) { r.MemoryLayers[1].PageMap.Size = 40 + 16*100 },
		"layers on a raw format": func(r *Record) { r.MemoryFormat = MemoryFormatRaw },
	}
	for name, brk := range breaks {
		r := layeredRecord()
		r.MemoryLayers = append([]LayerDescriptor(nil), r.MemoryLayers...)
		pm := *r.MemoryLayers[1].PageMap
		r.MemoryLayers[1].PageMap = &pm
		crc := *r.MemoryLayers[1].Digests
		r.MemoryLayers[1].Digests = &crc
		brk(&r)
		if err := r.Validate(); !errors.Is(err, ErrIntegrity) {
			t.Errorf("%s: Validate = %v, want ErrIntegrity", name, err)
		}
	}
}

// TestLayeredCoreNamesEveryLayer pins core version 2 and checks that a
// change to any ancestor layer's descriptor breaks the child's signature.
func TestLayeredCoreNamesEveryLayer(t *testing.T) {
	core, err := SignedCore(layeredRecord())
	if err != nil {
		t.Fatal(err)
	}
	s := string(core)
	for _, want := range []string{
		"warmstart snapshot record core v2\n",
		"format 3\n",
		"memory 4194304 - layers-v1\n",
		"memory_digests -\nmemory_sha256_digests -\nmemory_chunks -\n",
		"parent 0192d3a4-5b6c-7d8e-9f00-112233445566\nmemory_layers 2\n",
		"layer 0 0192d3a4-5b6c-7d8e-9f00-112233445566 memory full 4194304 " + strings.Repeat("b", 64) + " chunks-v1 99 " +
			strings.Repeat("d", 64) + " 1048576 - crc32c-4k 4096 4120 " + strings.Repeat("9", 64) + " sha256-4k 4096 32792 " + strings.Repeat("c", 64) + "\n",
		"layer 1 " + childID + " layer-eeeeeeeeeeeeeeee diff 12288 " + strings.Repeat("e", 64) + " raw - 72 " + strings.Repeat("f", 64) + " 3 1 ",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("core lacks %q:\n%s", want, s)
		}
	}
	_, key, _ := ed25519.GenerateKey(nil)
	signed, err := SignRecord(layeredRecord(), key)
	if err != nil {
		t.Fatal(err)
	}
	if sig := signed.Signatures[0]; sig.Core != CoreVersionLayered || sig.Verify(signed) != nil {
		t.Fatalf("signature core %d: %v", sig.Core, sig.Verify(signed))
	}
	changed := signed
	changed.MemoryLayers = append([]LayerDescriptor(nil), signed.MemoryLayers...)
	strong := *changed.MemoryLayers[0].SHA256Digests
	strong.SHA256 = strings.Repeat("3", 64)
	changed.MemoryLayers[0].SHA256Digests = &strong
	if err := signed.Signatures[0].Verify(changed); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("an ancestor's table swapped: Verify = %v, want ErrBadSignature", err)
	}
	downgraded := signed.Signatures[0]
	downgraded.Core = CoreVersion
	if err := downgraded.Verify(signed); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("core version 1 on a layered record: Verify = %v", err)
	}
	if MemoryIdentity := signed.MemoryIdentity(); !strings.HasPrefix(MemoryIdentity, "layers:") || MemoryIdentity == changed.MemoryIdentity() {
		t.Fatalf("memory identity %q does not follow the layers", MemoryIdentity)
	}
}
