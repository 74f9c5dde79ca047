package repository

import (
	"time"

	"warmstart/internal/integrity"
	"warmstart/internal/layout"
)

// StoredArtifact is what a record says about one stored artifact.
type StoredArtifact struct {
	Size   int64
	SHA256 string
}

// DigestTables are the encoded digest tables of a memory file, as a
// publish stores them (integrity.Tables).
type DigestTables struct {
	CRC, SHA256 []byte
}

// EncodeTables encodes what t built.
func EncodeTables(t integrity.Tables) DigestTables {
	return DigestTables{CRC: t.CRC.Table().Encode(), SHA256: t.SHA256.Table().Encode()}
}

// NewRecord is the record that makes snapshot id visible once Publish has
// stored its artifacts: req's alias and layout, the VM state and memory
// file as stored, and the descriptors of the memory file's encoded digest
// tables.
func NewRecord(id string, req PublishRequest, vm, mem StoredArtifact, tables DigestTables) Record {
	d, strong := DescribeDigests(tables.CRC), DescribeDigests(tables.SHA256)
	return Record{
		Format:              RecordFormatVersion,
		ID:                  id,
		Alias:               req.Alias,
		CreatedAt:           time.Now().UTC().Round(0),
		Layout:              cloneLayout(req.Layout),
		VMStateSize:         vm.Size,
		VMStateSHA256:       vm.SHA256,
		MemorySize:          mem.Size,
		MemorySHA256:        mem.SHA256,
		MemoryDigests:       &d,
		MemorySHA256Digests: &strong,
		MemoryFormat:        MemoryFormatRaw,
		ManifestRequested:   req.RecordManifest,
	}
}

// cloneLayout copies the region slice so the record does not share it with
// the caller.
func cloneLayout(l layout.Layout) layout.Layout {
	l.Regions = append([]layout.Region(nil), l.Regions...)
	return l
}
