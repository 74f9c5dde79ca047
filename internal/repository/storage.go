package repository

import "fmt"

// Memory formats a record names (Record.MemoryFormat).
const (
	// MemoryFormatRaw: the memory file is stored as it is, one file or
	// object (MemoryFileName).
	MemoryFormatRaw = "raw"
	// MemoryFormatChunks: the memory file is a chunk map (package
	// chunkmap) naming content-addressed, zstd-compressed chunk objects
	// shared by every snapshot that holds the same bytes.
	MemoryFormatChunks = "chunks-v1"
)

// ChunkMapDescriptor identifies the chunk map of a chunked memory file.
type ChunkMapDescriptor struct {
	// SHA256 and Size are those of the encoded map.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	// ChunkBytes is the logical size of a chunk.
	ChunkBytes int64 `json:"chunk_bytes"`
	// StoredBytes is the compressed size of the distinct chunk objects the
	// map references (some may be shared with other snapshots).
	StoredBytes int64 `json:"stored_bytes"`
}

// StartupPackDescriptor identifies a startup pack: the startup manifest's
// pages in first-touch order, compressed in frames, with its index.
type StartupPackDescriptor struct {
	// ManifestSHA256 is the manifest the pack was built from; a pack of
	// another manifest is never used.
	ManifestSHA256 string `json:"manifest_sha256"`
	// IndexSHA256 and IndexSize are those of the encoded pack index.
	IndexSHA256 string `json:"index_sha256"`
	IndexSize   int64  `json:"index_size"`
	// StoredBytes is the pack object's size; LogicalBytes what it unpacks to.
	StoredBytes  int64 `json:"stored_bytes"`
	LogicalBytes int64 `json:"logical_bytes"`
	// Restores is, for a refined pack (Record.RefinedPack), how many
	// restores its refinement had learned from when it was built: a
	// backend builds a new one only some restores later (bounded work).
	Restores uint64 `json:"restores,omitempty"`
}

// RequiresDigests reports whether every publish of r's format gave it a
// digest table: records of format 2 on (digest tables came first), so
// one without a table was changed after publish. A format-1 record may
// predate tables.
func (r Record) RequiresDigests() bool { return r.Format >= 2 }

// validateStorage checks the memory format fields.
func (r Record) validateStorage() error {
	switch r.MemoryFormat {
	case "":
		if r.Format >= 2 {
			return fmt.Errorf("%w: record format %d names no memory_format", ErrIntegrity, r.Format)
		}
	case MemoryFormatRaw, MemoryFormatLayers:
	case MemoryFormatChunks:
		c := r.MemoryChunks
		if c == nil || !isSHA256Hex(c.SHA256) || c.Size <= 0 || c.ChunkBytes <= 0 || c.ChunkBytes%4096 != 0 || c.StoredBytes < 0 {
			return fmt.Errorf("%w: record memory_chunks descriptor is missing or malformed", ErrIntegrity)
		}
	default:
		return fmt.Errorf("%w: record memory_format %q is not one this build reads", ErrIntegrity, r.MemoryFormat)
	}
	if r.MemoryFormat != MemoryFormatChunks && r.MemoryChunks != nil {
		return fmt.Errorf("%w: record memory_chunks given for memory_format %q", ErrIntegrity, r.MemoryFormat)
	}
	return r.validatePacks()
}

// validatePacks checks the startup pack descriptors: a recorded pack names
// the record's manifest, a refined pack goes with a refinement.
func (r Record) validatePacks() error {
	if p := r.StartupPack; p != nil {
		if r.Manifest == nil || p.ManifestSHA256 != r.Manifest.SHA256 || !p.wellFormed() {
			return fmt.Errorf("%w: record startup_pack descriptor is malformed or names another manifest", ErrIntegrity)
		}
	}
	if p := r.RefinedPack; p != nil {
		if r.Refinement == nil || !p.wellFormed() {
			return fmt.Errorf("%w: record refined_pack descriptor is malformed or the record has no refinement", ErrIntegrity)
		}
	}
	return nil
}

// wellFormed reports whether every field of d is in range.
func (d StartupPackDescriptor) wellFormed() bool {
	return isSHA256Hex(d.ManifestSHA256) && isSHA256Hex(d.IndexSHA256) && d.IndexSize > 0 && d.StoredBytes > 0 && d.LogicalBytes > 0
}
