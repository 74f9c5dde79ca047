package repository

import (
	"time"

	"warmstart/internal/layout"
)

// StoredArtifact is what a record says about one stored artifact.
type StoredArtifact struct {
	Size   int64
	SHA256 string
}

// NewRecord is the record that makes snapshot id visible once Publish has
// stored its artifacts: req's alias and layout, the VM state and memory
// file as stored, and the descriptor of the memory file's encoded digest
// table.
func NewRecord(id string, req PublishRequest, vm, mem StoredArtifact, digests []byte) Record {
	d := DescribeDigests(digests)
	return Record{
		Format:            RecordFormatVersion,
		ID:                id,
		Alias:             req.Alias,
		CreatedAt:         time.Now().UTC().Round(0),
		Layout:            cloneLayout(req.Layout),
		VMStateSize:       vm.Size,
		VMStateSHA256:     vm.SHA256,
		MemorySize:        mem.Size,
		MemorySHA256:      mem.SHA256,
		MemoryDigests:     &d,
		MemoryFormat:      MemoryFormatRaw,
		ManifestRequested: req.RecordManifest,
	}
}

// cloneLayout copies the region slice so the record does not share it with
// the caller.
func cloneLayout(l layout.Layout) layout.Layout {
	l.Regions = append([]layout.Region(nil), l.Regions...)
	return l
}
