package repository

import (
	"time"

	"warmstart/internal/memdev"
)

// MemorySource is the memory file of a snapshot whose backend keeps it
// remotely and serves it through a node-local cache instead of as a local
// file (Resolved.MemoryPath is then ""). A memory device opens one reader
// of it per device generation (memdev.Source.Open) and serves guest memory
// from it, so a restore reads only what the guest touches (and what
// prefetch asks for). What a reader reads stays cached at least until it
// is closed; it never returns bytes it could not verify.
type MemorySource interface {
	memdev.Source
	// Size is the memory file's size (Record.MemorySize).
	Size() int64
}

// MemorySource is the memory a device serves for r: the backend's remote
// source when it has one, else the local memory file.
func (r Resolved) MemorySource() memdev.Source {
	if r.Memory != nil {
		return r.Memory
	}
	return memdev.File(r.MemoryPath)
}

// CacheWarm is one prefetch of remote memory into a node-local cache, in
// progress (a memory source's startup stream or range warming).
type CacheWarm interface {
	// Stop cancels what has not been fetched and waits for the fetches in
	// progress.
	Stop()
	// Arrival says when its first block arrived and when it ended; each
	// is zero until it happened.
	Arrival() (firstBlock, ended time.Time)
}
