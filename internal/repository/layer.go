package repository

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"warmstart/internal/integrity"
	"warmstart/internal/layers"
)

// RecordFormatLayered is the record format of a snapshot whose memory is a
// chain of layers (MemoryFormatLayers, Record.MemoryLayers): a build that
// reads only format 2 would take it for a plain memory file and must refuse
// it rather than misread it. Records without layers keep
// RecordFormatVersion.
const RecordFormatLayered = 3

// MemoryFormatLayers: the memory is a chain of layers, bottom first
// (Record.MemoryLayers), each stored in its owner's artifacts.
const MemoryFormatLayers = "layers-v1"

// Layer kinds (LayerDescriptor.Kind).
const (
	// LayerFull is a whole memory file: the base of a chain.
	LayerFull = "full"
	// LayerDiff holds the pages that differ from every layer below it,
	// with a page map saying which.
	LayerDiff = "diff"
)

// Layer storage formats (LayerDescriptor.Format): as MemoryFormatRaw and
// MemoryFormatChunks for a plain memory file.
const (
	LayerRaw    = MemoryFormatRaw
	LayerChunks = MemoryFormatChunks
)

// BaseLayerName is the name of a full layer: the owner's plain memory
// artifacts (MemoryFileName, DigestsFileName, ...).
const BaseLayerName = "memory"

// MaxDepth is the most diff layers a record's chain has.
const MaxDepth = layers.MaxLayers - 1

// LayerDescriptor describes one layer of a layered record's memory.
type LayerDescriptor struct {
	// Snapshot is the layer's owner: the snapshot whose artifacts hold
	// it. A child names its ancestors' layers and copies none of them.
	Snapshot string `json:"snapshot"`
	// Name is BaseLayerName for a full layer (its owner's plain memory
	// artifacts), else layers.LayerName of its data's SHA-256.
	Name string `json:"name"`
	// Kind is LayerFull (layer 0 only) or LayerDiff.
	Kind string `json:"kind"`
	// Size is the stored data's size: the memory size for a full layer,
	// 4096 per data page for a diff layer. SHA256 is the data's.
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// Format is LayerRaw (one file or object) or LayerChunks (a chunk map,
	// Chunks).
	Format string              `json:"format"`
	Chunks *ChunkMapDescriptor `json:"chunks,omitempty"`
	// PageMap describes a diff layer's page map; nil for a full layer.
	PageMap *PageMapDescriptor `json:"page_map,omitempty"`
	// Digests and SHA256Digests describe the data's two tables; a layered
	// record needs both for every layer (no downgrade).
	Digests       *DigestsDescriptor `json:"digests"`
	SHA256Digests *DigestsDescriptor `json:"sha256_digests"`
}

// PageMapDescriptor identifies a diff layer's encoded page map.
type PageMapDescriptor struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	// DataPages and ZeroPages are the map's counts (DataPages × 4096 is
	// the layer's Size).
	DataPages int64 `json:"data_pages"`
	ZeroPages int64 `json:"zero_pages"`
}

// DescribePageMap returns the descriptor of an encoded page map m.
func DescribePageMap(m *layers.PageMap) PageMapDescriptor {
	enc := m.Encode()
	sum := sha256.Sum256(enc)
	return PageMapDescriptor{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(enc)),
		DataPages: m.DataPages(), ZeroPages: m.ZeroPages()}
}

// Layered reports whether r's memory is a chain of layers.
func (r Record) Layered() bool { return r.MemoryFormat == MemoryFormatLayers }

// Depth is the number of diff layers of r's memory: 0 unless layered.
func (r Record) Depth() int { return max(len(r.MemoryLayers)-1, 0) }

// Layers is r's memory as layers, bottom first: its MemoryLayers, or its
// plain memory as the single layer 0 (BaseLayerOf).
func (r Record) Layers() []LayerDescriptor {
	if r.Layered() {
		return r.MemoryLayers
	}
	return []LayerDescriptor{BaseLayerOf(r)}
}

// MemoryIdentity names r's memory bytes: MemorySHA256 for a plain record,
// "layers:" and the SHA-256 of its layers' canonical lines for a layered
// one. Equal identities serve equal bytes (a device shares a generation
// only between them).
func (r Record) MemoryIdentity() string {
	if !r.Layered() {
		return r.MemorySHA256
	}
	h := sha256.New()
	for i, l := range r.MemoryLayers {
		fmt.Fprintln(h, layerLine(i, l))
	}
	return "layers:" + hex.EncodeToString(h.Sum(nil))
}

// BaseLayerOf is a plain record's memory as layer 0 of a chain: the full
// layer its own memory artifacts hold.
func BaseLayerOf(r Record) LayerDescriptor {
	return LayerDescriptor{Snapshot: r.ID, Name: BaseLayerName, Kind: LayerFull, Size: r.MemorySize,
		SHA256: r.MemorySHA256, Format: r.MemoryFormat, Chunks: r.MemoryChunks,
		Digests: r.MemoryDigests, SHA256Digests: r.MemorySHA256Digests}
}

// Owners is the distinct owners of r's layers other than r itself, bottom
// first: the snapshots r depends on.
func (r Record) Owners() []string {
	var out []string
	for _, l := range r.Layers() {
		if l.Snapshot != r.ID && !containsString(out, l.Snapshot) {
			out = append(out, l.Snapshot)
		}
	}
	return out
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// layerLine is one layer's canonical line (MemoryIdentity and the signed
// core of a layered record).
func layerLine(i int, l LayerDescriptor) string {
	chunks, pm := "-", "-"
	if c := l.Chunks; c != nil {
		chunks = fmt.Sprint(c.Size, " ", c.SHA256, " ", c.ChunkBytes)
	}
	if p := l.PageMap; p != nil {
		pm = fmt.Sprint(p.Size, " ", p.SHA256, " ", p.DataPages, " ", p.ZeroPages)
	}
	table := func(d *DigestsDescriptor) string {
		if d == nil {
			return "-"
		}
		return fmt.Sprint(d.Algorithm, " ", d.BlockBytes, " ", d.Size, " ", d.SHA256)
	}
	return strings.Join([]string{"layer", fmt.Sprint(i), l.Snapshot, l.Name, l.Kind, fmt.Sprint(l.Size), l.SHA256,
		l.Format, chunks, pm, table(l.Digests), table(l.SHA256Digests)}, " ")
}

// LayerPublishRequest names what a pause publishes as a child of Parent.
type LayerPublishRequest struct {
	// Parent is the snapshot the child was paused from, as re-read at the
	// pause: its current layers (or its plain memory as layer 0).
	Parent Record
	// VMStatePath is the device state the VMM saved at the pause.
	VMStatePath string
	// Layer is the child's own diff layer; nil when nothing differs (the
	// child then takes the parent's layers as they are).
	Layer *layers.Built
	// Merged says Layer replaces every diff layer of Parent (it holds all
	// their pages): the child's chain is Parent's base and Layer.
	Merged bool
	// Alias is bound to the child when not empty.
	Alias string
	// Manifest is the child's startup manifest, validated by the caller;
	// the repository checks its size bounds. Empty: none.
	Manifest []byte
	// Recording says how Manifest was made (Harvested set for a pause).
	Recording *Recording
	// Link, where the backend keeps local files, hard-links the staging
	// files instead of copying them (staging inside the store).
	Link bool
	// Progress, when not nil, is told how the import goes.
	Progress func(ImportProgress)
}

// ReplaceMemoryRequest is a flatten: new memory for a published snapshot
// that no other snapshot depends on, with the same bytes.
type ReplaceMemoryRequest struct {
	// Expect is the record the new memory was built from: ReplaceMemory
	// fails with ErrStale if the record's memory changed since.
	Expect Record
	// Layer, when not nil, is one diff layer replacing every diff layer
	// of Expect over its base (the record stays layered, depth 1).
	Layer *layers.Built
	// MemoryPath, when not "", is a full memory file replacing the whole
	// chain: the record becomes a plain one (depth 0) that depends on no
	// ancestor. Exactly one of Layer and MemoryPath is set.
	MemoryPath string
	// Link and Progress are as in PublishRequest.
	Link     bool
	Progress func(ImportProgress)
}

// Layers is the part of the contract for layered memory: pausing a
// running sandbox into a child snapshot, flattening one, and the
// lifetimes that keep every ancestor a child reads.
type Layers interface {
	// PublishLayer publishes the lease's snapshot as a child of
	// req.Parent, whose layers it names and does not copy. It first
	// registers the child as a dependent of every owner of those layers
	// and re-checks each owner's record (a deleted or deleting owner
	// fails the publish), then stores the child's artifacts, then writes
	// its record last: the single visibility point, as for Publish, with
	// Publish's guarantees for the alias and for failures and crashes.
	PublishLayer(ctx context.Context, lease Lease, req LayerPublishRequest) (Record, error)
	// ReplaceMemory swaps the memory of the lease's snapshot for equal
	// bytes stored anew (a flatten), under the record lock: new artifacts
	// first under new names, the record next, the old layer's artifacts
	// last. It is refused with a *DependentsError while others depend on
	// the snapshot.
	ReplaceMemory(ctx context.Context, lease Lease, req ReplaceMemoryRequest) (Record, error)
	// Dependents lists the snapshots whose memory names a layer owned by
	// id: live ones (a record that still does) and in progress ones (a
	// publish under a live lease). Stale registrations are not listed.
	Dependents(ctx context.Context, id string) (live, inProgress []string, err error)
}

// validateLayered checks what a record of RecordFormatLayered adds: its
// format and parent, and for a layered memory every layer's descriptor.
func (r Record) validateLayered() error {
	switch {
	case (r.Layered() || r.Parent != "") && r.Format < RecordFormatLayered:
		return fmt.Errorf("%w: record format %d has a parent or memory layers (format %d)", ErrIntegrity, r.Format, RecordFormatLayered)
	case r.Parent != "" && ValidateID(r.Parent) != nil:
		return fmt.Errorf("%w: record parent %q is not a UUIDv7", ErrIntegrity, r.Parent)
	case !r.Layered() && len(r.MemoryLayers) > 0:
		return fmt.Errorf("%w: record has memory layers but memory_format %q", ErrIntegrity, r.MemoryFormat)
	case !r.Layered():
		return nil
	}
	return r.validateLayers()
}

// validateLayers checks a layered record's memory: described only by its
// layers, whole pages, and every layer's descriptor.
func (r Record) validateLayers() error {
	switch {
	case len(r.MemoryLayers) == 0 || len(r.MemoryLayers) > MaxDepth+1:
		return fmt.Errorf("%w: record has %d memory layers (want 1..%d)", ErrIntegrity, len(r.MemoryLayers), MaxDepth+1)
	case r.MemorySHA256 != "" || r.MemoryDigests != nil || r.MemorySHA256Digests != nil || r.MemoryChunks != nil:
		return fmt.Errorf("%w: layered record describes its memory outside its layers", ErrIntegrity)
	case r.MemorySize%layers.PageBytes != 0:
		return fmt.Errorf("%w: layered memory of %d bytes is not whole pages", ErrIntegrity, r.MemorySize)
	}
	for i, l := range r.MemoryLayers {
		if err := l.validate(i, r.MemorySize); err != nil {
			return fmt.Errorf("%w: record memory layer %d: %v", ErrIntegrity, i, err)
		}
		if l.Snapshot == r.ID && i != len(r.MemoryLayers)-1 {
			return fmt.Errorf("%w: record memory layer %d is its own but not its top layer", ErrIntegrity, i)
		}
	}
	return nil
}

// validate checks descriptor i of a chain of a memorySize-byte memory.
func (l LayerDescriptor) validate(i int, memorySize int64) error {
	if ValidateID(l.Snapshot) != nil || !isSHA256Hex(l.SHA256) || l.Size < 0 {
		return fmt.Errorf("owner %q, size %d or SHA-256 %q malformed", l.Snapshot, l.Size, l.SHA256)
	}
	if err := l.validateKind(i, memorySize); err != nil {
		return err
	}
	if err := l.validateStorage(); err != nil {
		return err
	}
	if err := l.Digests.validateAs(integrity.CRC32C, l.Size); err != nil {
		return fmt.Errorf("digest table: %v", err)
	}
	if err := l.SHA256Digests.validateAs(integrity.SHA256, l.Size); err != nil {
		return fmt.Errorf("SHA-256 digest table: %v", err)
	}
	return nil
}

// validateStorage checks the layer's format, chunk map and that it has
// both tables.
func (l LayerDescriptor) validateStorage() error {
	switch {
	case l.Format != LayerRaw && l.Format != LayerChunks:
		return fmt.Errorf("format %q is not one this build reads", l.Format)
	case (l.Format == LayerChunks) != (l.Chunks != nil):
		return fmt.Errorf("chunk map descriptor does not go with format %q", l.Format)
	case l.Chunks != nil && !l.Chunks.wellFormed():
		return fmt.Errorf("chunk map descriptor malformed")
	case l.Digests == nil || l.SHA256Digests == nil:
		return fmt.Errorf("a layer needs both digest tables")
	}
	return nil
}

// wellFormed reports whether c can describe a chunk map.
func (c *ChunkMapDescriptor) wellFormed() bool {
	return isSHA256Hex(c.SHA256) && c.Size > 0 && c.ChunkBytes > 0 && c.ChunkBytes%layers.PageBytes == 0 && c.StoredBytes >= 0
}

// validateKind checks that layer 0 is the full base and the rest diff
// layers whose page map and name agree with their data.
func (l LayerDescriptor) validateKind(i int, memorySize int64) error {
	if i == 0 {
		if l.Kind != LayerFull || l.Name != BaseLayerName || l.Size != memorySize || l.PageMap != nil {
			return fmt.Errorf("layer 0 must be the full memory %q of %d bytes without a page map", BaseLayerName, memorySize)
		}
		return nil
	}
	if l.Kind != LayerDiff || l.Name != layers.LayerName(l.SHA256) {
		return fmt.Errorf("want a diff layer named %s, have %s %q", layers.LayerName(l.SHA256), l.Kind, l.Name)
	}
	if l.PageMap == nil {
		return fmt.Errorf("page map descriptor missing")
	}
	return l.PageMap.validate(l.Size, memorySize)
}

// validate checks a diff layer's page map descriptor against the layer's
// data size and the memory's.
func (p *PageMapDescriptor) validate(dataSize, memorySize int64) error {
	pages := memorySize / layers.PageBytes
	switch {
	case !isSHA256Hex(p.SHA256) || p.DataPages < 0 || p.ZeroPages < 0:
		return fmt.Errorf("page map descriptor malformed")
	case p.DataPages > pages || p.ZeroPages > pages-p.DataPages:
		return fmt.Errorf("page map of %d data and %d zero pages does not fit a %d-byte memory", p.DataPages, p.ZeroPages, memorySize)
	case dataSize != p.DataPages*layers.PageBytes:
		return fmt.Errorf("%d bytes of data for %d data pages", dataSize, p.DataPages)
	case p.Size < 40 || (p.Size-40)%16 != 0 || p.Size > 40+16*(p.DataPages+p.ZeroPages):
		return fmt.Errorf("page map of %d bytes cannot hold runs of %d pages", p.Size, p.DataPages+p.ZeroPages)
	}
	return nil
}

// writeLayeredCore appends what core version 2 adds to version 1's lines:
// the parent and every layer's canonical line.
func writeLayeredCore(b *strings.Builder, rec Record) {
	parent := rec.Parent
	if parent == "" {
		parent = "-"
	}
	fmt.Fprintf(b, "parent %s\n", parent)
	fmt.Fprintf(b, "memory_layers %d\n", len(rec.MemoryLayers))
	for i, l := range rec.MemoryLayers {
		b.WriteString(layerLine(i, l))
		b.WriteByte('\n')
	}
}
