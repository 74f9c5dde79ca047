package bench

import (
	"fmt"

	"warmstart/internal/config"
)

// Readaround is the pair of file-device readaround windows a bench's
// trials mount with: the operator's [memory] windows, so that a bench run
// with --config measures that configuration. Each trial runs in its own
// process, so its spec carries them.
type Readaround struct {
	// ServingBytes is the serving mount's window, for restores that do not
	// prefetch (memory.readaround_kib); 0 is the device's default.
	ServingBytes int `json:"readaround_bytes"`
	// PrefetchingBytes is the window of restores that prefetch
	// (memory.prefetch_readaround_kib); 0 is its default.
	PrefetchingBytes int `json:"prefetch_readaround_bytes"`
}

// ReadaroundOf is the windows cfg gives a node's file device.
func ReadaroundOf(cfg *config.Config) Readaround {
	return Readaround{
		ServingBytes:     cfg.Memory.ReadaroundBytes(cfg.Snapshot.RepositoryBackend),
		PrefetchingBytes: cfg.Memory.PrefetchReadaroundBytes(),
	}
}

// withDefaults fills a zero prefetching window with its default, as
// config.MemoryConfig.PrefetchReadaroundBytes does for a zero key.
func (r Readaround) withDefaults() Readaround {
	if r.PrefetchingBytes <= 0 {
		r.PrefetchingBytes = config.DefaultPrefetchReadaroundKiB << 10
	}
	return r
}

// String says the windows for the bench's first line.
func (r Readaround) String() string {
	serving := fmt.Sprintf("%d KiB", r.ServingBytes>>10)
	if r.ServingBytes == 0 {
		serving = "the device's default"
	}
	return fmt.Sprintf("file device readaround: %s without prefetch (memory.readaround_kib), %d KiB with prefetch (memory.prefetch_readaround_kib)",
		serving, r.PrefetchingBytes>>10)
}
