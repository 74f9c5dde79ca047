package s3bench

import (
	"context"
	"fmt"

	"warmstart/internal/repository/s3"
)

// Storage is what the benchmarked snapshot costs in the bucket.
type Storage struct {
	// RawBytes is the memory file's size.
	RawBytes int64 `json:"raw_bytes"`
	// StoredBytes is the compressed size of the chunk objects the snapshot
	// references.
	StoredBytes int64 `json:"stored_bytes"`
	// StartupSetStoredBytes is the startup pack's size: what a cold node
	// must fetch before ready.
	StartupSetStoredBytes int64 `json:"startup_set_stored_bytes"`
}

// measureStorage reads the published snapshot's record for its sizes.
func (h *harness) measureStorage(ctx context.Context, repo *s3.Repo) error {
	rec, err := repo.Get(ctx, h.snapID)
	if err != nil {
		return fmt.Errorf("s3 bench: %w", err)
	}
	h.storage.RawBytes = rec.MemorySize
	if rec.MemoryChunks != nil {
		h.storage.StoredBytes = rec.MemoryChunks.StoredBytes
	}
	if rec.StartupPack != nil {
		h.storage.StartupSetStoredBytes = rec.StartupPack.StoredBytes
	}
	fmt.Fprintf(h.o.Progress, "stored: %.1f MiB of %.1f MiB raw (%.2fx); startup pack %.1f MiB\n",
		mib(uint64(h.storage.StoredBytes)), mib(uint64(h.storage.RawBytes)),
		float64(h.storage.StoredBytes)/float64(max(1, h.storage.RawBytes)), mib(uint64(h.storage.StartupSetStoredBytes)))
	return nil
}
