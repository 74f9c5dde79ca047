package repository

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"warmstart/internal/layers"
)

// File names of a layer's artifacts in its owner's snapshot: name is
// LayerDescriptor.Name, so the base layer's are today's memory artifacts
// (memory.bin, memory.digests, memory.sha256-digests).
func LayerDataFile(name string) string          { return name + ".bin" }
func LayerPageMapFile(name string) string       { return name + ".pagemap" }
func LayerDigestsFile(name string) string       { return name + ".digests" }
func LayerSHA256DigestsFile(name string) string { return name + ".sha256-digests" }

// CheckedLayerPublish is what CheckLayerPublish found: the VM state's
// size, the layers the child inherits (bottom first, its own not yet
// among them) and the owners it must register with.
type CheckedLayerPublish struct {
	VMStateSize int64
	Inherited   []LayerDescriptor
	Owners      []string
}

// CheckLayerPublish validates what every backend validates before a
// layer publish imports anything: the alias, the VM state file, the
// parent record (valid, every layer with both tables), the layer (of the
// parent's memory, its map consistent with its size), the depth bound,
// the manifest's size and the recording.
func CheckLayerPublish(id string, req LayerPublishRequest) (CheckedLayerPublish, error) {
	var c CheckedLayerPublish
	if req.Alias != "" {
		if err := ValidateNewAlias(req.Alias); err != nil {
			return c, err
		}
	}
	p := req.Parent
	if err := p.Validate(); err != nil {
		return c, fmt.Errorf("%w: parent record: %w", ErrInvalidRequest, err)
	}
	if p.ID == id {
		return c, fmt.Errorf("%w: a snapshot cannot be its own parent", ErrInvalidRequest)
	}
	vmSize, err := regularFileSize(req.VMStatePath, "vm state")
	if err != nil {
		return c, err
	}
	if vmSize == 0 {
		return c, fmt.Errorf("%w: vm state file %s is empty", ErrInvalidRequest, req.VMStatePath)
	}
	inherited, err := inheritedLayers(req)
	if err != nil {
		return c, err
	}
	if err := checkLayerAttachments(req); err != nil {
		return c, err
	}
	c = CheckedLayerPublish{VMStateSize: vmSize, Inherited: inherited}
	for _, l := range inherited {
		if !containsString(c.Owners, l.Snapshot) {
			c.Owners = append(c.Owners, l.Snapshot)
		}
	}
	return c, nil
}

// inheritedLayers is the part of req.Parent's chain the child keeps.
func inheritedLayers(req LayerPublishRequest) ([]LayerDescriptor, error) {
	p := req.Parent
	below := p.Layers()
	for i, l := range below {
		if l.Digests == nil || l.SHA256Digests == nil {
			return nil, fmt.Errorf("%w: parent %s layer %d has no table of %s digests (`warmstart snapshot verify --add-digests %s`)",
				ErrInvalidRequest, p.ID, i, map[bool]string{true: "CRC-32C", false: "SHA-256"}[l.Digests == nil], l.Snapshot)
		}
	}
	if req.Layer == nil {
		if req.Merged {
			return nil, fmt.Errorf("%w: a merged publish needs its layer", ErrInvalidRequest)
		}
		return below, nil
	}
	m := req.Layer.Map
	switch {
	case m == nil || m.Validate() != nil || m.MemorySize != p.MemorySize:
		return nil, fmt.Errorf("%w: the layer's page map is missing, malformed or of another memory than the parent's %d bytes", ErrInvalidRequest, p.MemorySize)
	case m.DataBytes() != req.Layer.Size || !isSHA256Hex(req.Layer.SHA256):
		return nil, fmt.Errorf("%w: the layer's data (%d bytes) does not match its page map's %d data pages", ErrInvalidRequest, req.Layer.Size, m.DataPages())
	case p.MemorySize%layers.PageBytes != 0:
		return nil, fmt.Errorf("%w: parent memory of %d bytes is not whole pages", ErrInvalidRequest, p.MemorySize)
	}
	if req.Merged {
		below = below[:1]
	}
	if len(below) > MaxDepth {
		return nil, fmt.Errorf("%w: the child would have %d diff layers (at most %d; flatten first)", ErrInvalidRequest, len(below), MaxDepth)
	}
	return below, nil
}

// checkLayerAttachments checks the manifest's size and the recording.
func checkLayerAttachments(req LayerPublishRequest) error {
	if len(req.Manifest) > MaxManifestBytes {
		return fmt.Errorf("%w: manifest of %d bytes is over %d", ErrInvalidRequest, len(req.Manifest), MaxManifestBytes)
	}
	if r := req.Recording; r != nil {
		if len(req.Manifest) == 0 {
			return fmt.Errorf("%w: a recording without a manifest", ErrInvalidRequest)
		}
		if err := r.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
	}
	return nil
}

// CheckOwnerHolds refuses a child whose inherited layers owner no longer
// holds as the child names them: owner's memory was replaced (flattened)
// since the publisher read the parent, and the retired layer's files are
// gone or going. A backend calls it on the owner's current record once
// the child's marker there keeps a later replacement off.
func CheckOwnerHolds(owner Record, inherited []LayerDescriptor) error {
	have := owner.Layers()
	for _, l := range inherited {
		if l.Snapshot != owner.ID {
			continue
		}
		same := func(h LayerDescriptor) bool {
			return h.Snapshot == l.Snapshot && h.Name == l.Name && h.SHA256 == l.SHA256
		}
		if !slices.ContainsFunc(have, same) {
			return fmt.Errorf("%w: layer owner %s no longer holds layer %s (its memory was replaced, as by a flatten, after the parent was read)",
				ErrStale, owner.ID, l.Name)
		}
	}
	return nil
}

// OwnLayer is the descriptor of a child's own diff layer as a backend
// stored it: the data's size and SHA-256 (checked against the built
// layer's), its tables, format and chunk map.
func OwnLayer(id string, b *layers.Built, format string, chunks *ChunkMapDescriptor, tables DigestTables) LayerDescriptor {
	crc, strong := DescribeDigests(tables.CRC), DescribeDigests(tables.SHA256)
	pm := DescribePageMap(b.Map)
	return LayerDescriptor{Snapshot: id, Name: b.Name(), Kind: LayerDiff, Size: b.Size, SHA256: b.SHA256,
		Format: format, Chunks: chunks, PageMap: &pm, Digests: &crc, SHA256Digests: &strong}
}

// NewLayerRecord is the record that makes a paused child visible: the
// parent's layout and memory size, the VM state as stored, the inherited
// layers and own (nil when the child has no layer of its own), and the
// manifest when one was stored.
func NewLayerRecord(id string, req LayerPublishRequest, c CheckedLayerPublish, vm StoredArtifact, own *LayerDescriptor) Record {
	ls := append([]LayerDescriptor(nil), c.Inherited...)
	if own != nil {
		ls = append(ls, *own)
	}
	rec := Record{
		Format: RecordFormatLayered, ID: id, Alias: req.Alias, CreatedAt: time.Now().UTC().Round(0),
		Layout: cloneLayout(req.Parent.Layout), VMStateSize: vm.Size, VMStateSHA256: vm.SHA256,
		MemorySize: req.Parent.MemorySize, MemoryFormat: MemoryFormatLayers, MemoryLayers: ls, Parent: req.Parent.ID,
	}
	if len(req.Manifest) > 0 {
		sum := sha256.Sum256(req.Manifest)
		rec.Manifest = &ManifestDescriptor{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(req.Manifest))}
		if req.Recording != nil {
			r := *req.Recording
			rec.ManifestRecording = &r
		}
	}
	return rec
}
