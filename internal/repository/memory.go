package repository

import "time"

// MemorySource is the memory file of a snapshot whose backend keeps it
// remotely and serves it through a node-local cache instead of as a local
// file (Resolved.MemoryPath is then ""). A memory device opens one
// MemoryReader per device generation and serves guest memory from it, so
// a restore reads only what the guest touches (and what prefetch asks for).
type MemorySource interface {
	// Ref names the bytes: sources with equal Refs serve equal bytes. A
	// memory device shares a generation only between attaches of one Ref.
	Ref() string
	// Size is the memory file's size (Record.MemorySize).
	Size() int64
	// OpenMemory returns a reader of the memory file. What it reads stays
	// cached at least until it is closed.
	OpenMemory() (MemoryReader, error)
}

// MemoryReader reads a remote memory file. ReadAt returns len(p) bytes (or
// fewer, with io.EOF, at the end of the file) or an error; it never returns
// bytes it could not verify. It is safe for concurrent use.
type MemoryReader interface {
	ReadAt(p []byte, off int64) (int, error)
	Size() int64
	Close() error
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
