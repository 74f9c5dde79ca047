// Package chunkcache is the node-local cache of snapshot memory that lives
// in an object store. A memory object is cut into fixed-size blocks; a
// block is fetched with one ranged GET (or as part of a longer run), kept
// on local disk, and served from there to every memory device on the node.
//
// What it guarantees:
//
//   - Bounded: the bytes of cached blocks never exceed Options.MaxBytes.
//     Room is made by evicting the least recently used block whose object
//     is not pinned. An object is pinned while a Reader of it is open (a
//     memory device serving it is attached) or a Warming of it runs. When
//     every cached block is pinned, a new block is served to its readers
//     but not kept.
//   - One fetch per block: concurrent misses on one block, from demand
//     reads or from prefetch runs, wait for the single fetch in flight
//     (a demand miss joins a prefetch run's fetch rather than issuing its
//     own GET).
//   - Crash safe: a block becomes a file only through a temporary file that
//     is written, fsynced and renamed. Its name carries its length and its
//     CRC-32C, computed from the bytes as they arrived, and a block found on
//     disk when the cache is opened is checked against both before it is
//     first served. A torn, truncated or corrupted file is discarded and the
//     block fetched again; it is never served.
//
// Blocks are served from memory as soon as their fetch completes; writing
// them to disk happens in the background, so no reader waits for an fsync,
// and waits while a warming runs (hold.go).
// Lost renames after a crash only cost a refetch, so the directory is not
// synced per block.
//
// Content identity: Object.ID must name the bytes (the backend uses the
// memory file's SHA-256), so snapshots with identical memory share blocks
// and a block never outlives the meaning of its name.
package chunkcache

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults. The block size, run cap (plan.go) and warm concurrency
// (warm.go) were chosen with package s3bench: the 128 MiB reference snapshot
// (its manifest: 40 MiB in 3,436 ranges, touching every 1 MiB of memory) in
// MinIO behind Toxiproxy adding 5 ms per response and 1 Gbit/s per
// connection, mean time to ready from an empty node cache over 3-5 blocks
// on a shared 2-core host (so ±15%):
//
//	block    prefetch off   prefetch on (8 MiB runs, 8 at once)
//	256 KiB  5,343 ms       1,256 ms
//	512 KiB  3,886 ms       1,003 ms
//	1 MiB    2,668 ms         531 ms
//	2 MiB    2,170 ms         638 ms
//	4 MiB    1,965 ms         619 ms
//
// Every size fetched the whole 128 MiB: the startup set is scattered at
// page granularity, so smaller blocks only add requests (and per-block
// work: a 256 KiB block costs a write and an fsync like a 1 MiB one).
// Larger blocks make demand-only restores faster but slow the prefetch,
// whose runs then stream fewer, larger units; 1 MiB is fastest with
// prefetch and within 35% of the best without.
const (
	// DefaultBlockBytes is the cache block: the unit of a demand fetch.
	DefaultBlockBytes = 1 << 20
	// DefaultFetchTimeout bounds one demand fetch. A read that cannot be
	// served in this time fails (the device answers EIO) rather than
	// hanging the VMM.
	DefaultFetchTimeout = 30 * time.Second
	// DefaultFailureHoldoff is how long demand reads of a block whose fetch
	// failed fail at once with that error instead of fetching again. A
	// successful fetch of another block of the object ends it early (the
	// store is back).
	//
	// Why: a page fault waiting on a slow read is restarted from scratch
	// whenever a signal reaches the faulting thread (the kernel returns to
	// user space to deliver it), and the restarted fault reads again. A
	// VMM whose threads get signals often (a Go process gets SIGURG
	// preemption signals every 10 ms) would so turn a read failing after a
	// second of retries into an endless loop of reads; failing the reads
	// that follow at once lets the kernel complete the fault (SIGBUS) and
	// keeps faults from hammering a store that is down. The restarted
	// fault's read follows the failure within milliseconds; a quarter of a
	// second covers it with room to spare, and is short enough that the
	// next restore after the store comes back finds the block fetchable.
	// A fault the kernel retries more slowly still found the holdoff over
	// and fetched again (a store killed in the middle of a restore without
	// prefetch kept its VM faulting for 5–15 s); so each fetch of the block
	// that fails again doubles its holdoff, up to 16 times (4 s), which
	// brought that to 1–5 s.
	DefaultFailureHoldoff = 250 * time.Millisecond
	// persistQueueBlocks bounds the blocks waiting to be written to disk;
	// fetches wait when it is full, so memory stays bounded when the disk
	// is slower than the network.
	persistQueueBlocks = 64
	// persistWorkers write blocks to disk in the background.
	persistWorkers = 2
)

// Sentinel errors.
var (
	// ErrClosed: the cache was closed.
	ErrClosed = errors.New("chunk cache closed")
	// ErrInvalidObject: an Object with a bad ID, size or no Fetch.
	ErrInvalidObject = errors.New("invalid chunk cache object")
	// ErrShortFetch: the origin returned fewer bytes than asked for.
	ErrShortFetch = errors.New("object store returned fewer bytes than requested")
)

// FetchFunc reads bytes [off, off+length) of an object from its origin. The
// returned reader must yield exactly length bytes; fewer is an error.
type FetchFunc func(ctx context.Context, off, length int64) (io.ReadCloser, error)

// Object is one immutable object read through the cache.
type Object struct {
	// ID names the object's bytes: equal IDs must mean equal bytes. It is
	// used as a directory name, so it is 1..128 characters of
	// [A-Za-z0-9_-].
	ID    string
	Size  int64
	Fetch FetchFunc
}

func (o Object) validate() error {
	if !validID(o.ID) {
		return fmt.Errorf("%w: id %q", ErrInvalidObject, o.ID)
	}
	if o.Size <= 0 {
		return fmt.Errorf("%w: %s has size %d", ErrInvalidObject, o.ID, o.Size)
	}
	if o.Fetch == nil {
		return fmt.Errorf("%w: %s has no fetch function", ErrInvalidObject, o.ID)
	}
	return nil
}

func validID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Options configure a Cache.
type Options struct {
	// Dir holds the cached blocks. It is created if missing.
	Dir string
	// MaxBytes bounds the bytes of cached blocks; required.
	MaxBytes int64
	// BlockBytes is the block size; zero means DefaultBlockBytes. Open
	// removes blocks cached with another block size.
	BlockBytes int64
	// FetchTimeout bounds one demand fetch; zero means DefaultFetchTimeout.
	FetchTimeout time.Duration
	// FailureHoldoff is how long a failed block fails demand reads at once;
	// zero means DefaultFailureHoldoff, negative disables it.
	FailureHoldoff time.Duration
	// Log receives one line per discarded corrupt block and failed write.
	Log *slog.Logger
}

// Cache is a node-local block cache. Use one per node and directory.
type Cache struct {
	dir          string
	maxBytes     int64
	blockBytes   int64
	fetchTimeout time.Duration
	holdoff      time.Duration
	log          *slog.Logger
	// fullWarnedAt is when a fetched block not kept was last logged;
	// under mu.
	fullWarnedAt time.Time
	// writeWarnedAt is when a failed block write was last logged, and
	// writeFailures how many failed since; both under mu.
	writeWarnedAt time.Time
	writeFailures int

	mu        sync.Mutex
	entries   map[blockKey]*entry
	lru       list.List // of *entry; front is the most recently used
	usedBytes int64
	pins      map[string]int
	flights   map[blockKey]*flight
	failures  map[blockKey]failure
	closed    bool
	ops       sync.WaitGroup // reads and warmings in progress; Close waits

	persistQ  chan *entry
	persistWG sync.WaitGroup
	holds     writeHolds // hold.go
	// lock is held from Open to Close (lock.go).
	lock *dirLock

	stats   counters
	onFetch fetchObserver
}

// blockKey names one block of one object at one block size.
type blockKey struct {
	object string
	index  int64
}

// entry is a cached block: in memory until written, then on disk.
type entry struct {
	key    blockKey
	length int64
	crc    uint32
	// data holds the bytes until the block is on disk; immutable once set,
	// so readers copy from it outside the lock.
	data     []byte
	onDisk   bool
	verified bool
	// foreign marks a block found at Open while another process had the
	// directory open: that process may be serving it, so evicting it
	// here only drops it from this index and leaves the file.
	foreign bool
	elem    *list.Element
}

// failure is a block's recent failed fetch: its error, the end of its
// holdoff, and how many fetches of the block failed in a row.
type failure struct {
	err     error
	until   time.Time
	strikes int
	// refused: the bytes were fetched and refused (see Refuse), so a
	// fetch of another block succeeding does not end the holdoff.
	refused bool
}

// Open opens (creating if needed) the cache in o.Dir. Blocks already there
// are indexed, oldest first in the LRU, and checked on first use. When no
// other process has the directory open (lock.go), temporary files of
// interrupted writes are removed and, if the blocks exceed MaxBytes, the
// oldest are evicted at once; otherwise nothing is removed.
func Open(o Options) (*Cache, error) {
	if o.Dir == "" {
		return nil, errors.New("open chunk cache: no directory given")
	}
	if o.MaxBytes <= 0 {
		return nil, fmt.Errorf("open chunk cache %s: max size %d must be positive", o.Dir, o.MaxBytes)
	}
	if o.BlockBytes == 0 {
		o.BlockBytes = DefaultBlockBytes
	}
	if o.BlockBytes < 4096 || o.BlockBytes%4096 != 0 {
		return nil, fmt.Errorf("open chunk cache %s: block size %d is not a positive multiple of 4096", o.Dir, o.BlockBytes)
	}
	if o.FetchTimeout <= 0 {
		o.FetchTimeout = DefaultFetchTimeout
	}
	if o.FailureHoldoff == 0 {
		o.FailureHoldoff = DefaultFailureHoldoff
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("open chunk cache %s: %w", o.Dir, err)
	}
	c := &Cache{
		dir:          dir,
		maxBytes:     o.MaxBytes,
		blockBytes:   o.BlockBytes,
		fetchTimeout: o.FetchTimeout,
		holdoff:      o.FailureHoldoff,
		log:          o.Log,
		entries:      make(map[blockKey]*entry),
		pins:         make(map[string]int),
		flights:      make(map[blockKey]*flight),
		failures:     make(map[blockKey]failure),
		persistQ:     make(chan *entry, persistQueueBlocks),
	}
	c.holds.pressure = make(chan struct{}, 1)
	// Guest memory: no one else may list or read it (0700; a directory
	// that already exists keeps its mode).
	if err := os.MkdirAll(c.chunksDir(), 0o700); err != nil {
		return nil, fmt.Errorf("open chunk cache %s: %w", dir, err)
	}
	lock, err := lockDir(dir, c.index)
	if err != nil {
		return nil, fmt.Errorf("open chunk cache %s: %w", dir, err)
	}
	c.lock = lock
	for range persistWorkers {
		c.persistWG.Go(c.persistLoop)
	}
	return c, nil
}

// Dir is the cache directory.
func (c *Cache) Dir() string { return c.dir }

// BlockBytes is the block size.
func (c *Cache) BlockBytes() int64 { return c.blockBytes }

// MaxBytes is the bound on cached bytes.
func (c *Cache) MaxBytes() int64 { return c.maxBytes }

// Close waits for reads and warmings in progress (cancel warmings first
// with Warming.Stop), writes the blocks still in memory to disk, and makes
// every later operation fail with ErrClosed. It is safe to call again.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.ops.Wait()
	c.releaseAllWrites()
	close(c.persistQ)
	c.persistWG.Wait()
	if err := c.lock.release(); err != nil {
		return fmt.Errorf("close chunk cache %s: %w", c.dir, err)
	}
	return nil
}

// begin admits one operation unless the cache is closed.
func (c *Cache) begin() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.ops.Add(1)
	return nil
}

func (c *Cache) pin(object string) {
	c.mu.Lock()
	c.pins[object]++
	c.mu.Unlock()
}

func (c *Cache) unpin(object string) {
	c.mu.Lock()
	if c.pins[object]--; c.pins[object] <= 0 {
		delete(c.pins, object)
	}
	c.mu.Unlock()
}

// blockLength is the length of block idx of an object of size bytes.
func (c *Cache) blockLength(size, idx int64) int64 {
	return min(c.blockBytes, size-idx*c.blockBytes)
}

// blockCount is the number of blocks of an object of size bytes.
func (c *Cache) blockCount(size int64) int64 {
	return (size + c.blockBytes - 1) / c.blockBytes
}

// touchLocked marks e most recently used.
func (c *Cache) touchLocked(e *entry) { c.lru.MoveToFront(e.elem) }

// removeLocked drops e from the index and returns its file, if any, for
// the caller to remove once the lock is released.
func (c *Cache) removeLocked(e *entry) string {
	if c.entries[e.key] != e {
		return ""
	}
	delete(c.entries, e.key)
	c.lru.Remove(e.elem)
	c.usedBytes -= e.length
	if e.onDisk && !e.foreign {
		return c.chunkPath(e)
	}
	return ""
}

// evictLocked evicts least recently used unpinned blocks until need more
// bytes fit under the bound, or no unpinned block is left, and returns the
// files to remove.
func (c *Cache) evictLocked(need int64) []string {
	var files []string
	for c.usedBytes+need > c.maxBytes {
		var victim *entry
		for el := c.lru.Back(); el != nil; el = el.Prev() {
			if e := el.Value.(*entry); c.pins[e.key.object] == 0 {
				victim = e
				break
			}
		}
		if victim == nil {
			break
		}
		if f := c.removeLocked(victim); f != "" {
			files = append(files, f)
		}
		c.stats.evictions.Add(1)
	}
	return files
}

// insertLocked indexes a fetched block if room can be made for it and
// returns its entry (nil when it is not kept), the files of the blocks
// evicted for it, which the caller removes after unlocking, and whether
// it was not kept for want of room (see warnNotKept).
func (c *Cache) insertLocked(key blockKey, data []byte, crc uint32) (*entry, []string, bool) {
	n := int64(len(data))
	if c.closed || n > c.maxBytes || c.entries[key] != nil {
		// Closed, or larger than the whole cache, or a concurrent fetch
		// of the block (one that replaced a failed flight) got there first.
		return nil, nil, false
	}
	victims := c.evictLocked(n)
	if c.usedBytes+n > c.maxBytes {
		c.stats.uncached.Add(1)
		return nil, victims, true
	}
	e := &entry{key: key, length: n, crc: crc, data: data, verified: true}
	c.entries[key] = e
	e.elem = c.lru.PushFront(e)
	c.usedBytes += n
	c.notePeakLocked()
	return e, victims, false
}

// warnNotKept logs, at most once a minute, that a fetched block of object
// was not kept: every later read of it fetches again. It takes mu.
func (c *Cache) warnNotKept(object string) {
	c.mu.Lock()
	due := time.Since(c.fullWarnedAt) >= time.Minute
	if due {
		c.fullWarnedAt = time.Now()
	}
	c.mu.Unlock()
	if due {
		c.log.Warn("chunk cache: full of blocks of the objects being read; fetched blocks are not kept, "+
			"so reads fetch them again (a bound smaller than what restores read thrashes: raise it)",
			"max_bytes", c.maxBytes, "object", object)
	}
}

func (c *Cache) notePeakLocked() {
	for {
		peak := c.stats.peakBytes.Load()
		if c.usedBytes <= peak || c.stats.peakBytes.CompareAndSwap(peak, c.usedBytes) {
			return
		}
	}
}

// removeFiles unlinks evicted blocks' files. A reader that opened one
// still reads it; a failure only leaves a file the next Open indexes.
func (c *Cache) removeFiles(paths []string) {
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			c.log.Warn("chunk cache: remove block file", "path", p, "err", err)
		}
	}
}

// Stats are the cache's counters since Open.
type Stats struct {
	// Hits, Misses and Joins count block lookups of demand reads: found
	// cached, fetched by this read, or waited for a fetch in flight.
	Hits   uint64 `json:"hits"`
	Misses uint64 `json:"misses"`
	Joins  uint64 `json:"joins"`
	// Fetches counts ranged GETs issued (demand and prefetch);
	// FetchedBytes the bytes they returned; FetchErrors the failed ones.
	Fetches      uint64 `json:"fetches"`
	FetchedBytes uint64 `json:"fetched_bytes"`
	FetchErrors  uint64 `json:"fetch_errors"`
	// PrefetchedBlocks counts blocks fetched by warmings.
	PrefetchedBlocks uint64 `json:"prefetched_blocks"`
	// Evictions counts blocks evicted to make room; Uncached counts
	// fetched blocks not kept because every cached block was pinned.
	Evictions uint64 `json:"evictions"`
	Uncached  uint64 `json:"uncached"`
	// Corrupt counts blocks found torn, truncated or corrupted on disk and
	// discarded; Refused counts blocks dropped because a reader's own check
	// (the memory's digest table) refused their bytes (see Uncache).
	Corrupt uint64 `json:"corrupt"`
	Refused uint64 `json:"refused"`
	// HeldOff counts demand reads failed at once because their block's
	// fetch had just failed (see DefaultFailureHoldoff); FailedBlocks is the
	// number of blocks in their holdoff now.
	HeldOff      uint64 `json:"held_off"`
	FailedBlocks int    `json:"failed_blocks"`
	// UsedBytes is the bytes cached now; PeakBytes the most there have been.
	UsedBytes int64 `json:"used_bytes"`
	PeakBytes int64 `json:"peak_bytes"`
	// Blocks is the number of blocks cached now.
	Blocks int `json:"blocks"`
}

type counters struct {
	hits, misses, joins                atomic.Uint64
	fetches, fetchedBytes, fetchErrors atomic.Uint64
	prefetchedBlocks                   atomic.Uint64
	evictions, uncached, corrupt       atomic.Uint64
	refused                            atomic.Uint64
	heldOff                            atomic.Uint64
	peakBytes                          atomic.Int64
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	used, blocks := c.usedBytes, len(c.entries)
	failed := 0
	now := time.Now()
	for _, f := range c.failures {
		if now.Before(f.until) {
			failed++
		}
	}
	c.mu.Unlock()
	s := &c.stats
	return Stats{
		Hits: s.hits.Load(), Misses: s.misses.Load(), Joins: s.joins.Load(),
		Fetches: s.fetches.Load(), FetchedBytes: s.fetchedBytes.Load(), FetchErrors: s.fetchErrors.Load(),
		PrefetchedBlocks: s.prefetchedBlocks.Load(),
		Evictions:        s.evictions.Load(), Uncached: s.uncached.Load(), Corrupt: s.corrupt.Load(), Refused: s.refused.Load(),
		HeldOff: s.heldOff.Load(), FailedBlocks: failed,
		UsedBytes: used, PeakBytes: s.peakBytes.Load(), Blocks: blocks,
	}
}

// Uncache drops the cached blocks of object that hold any byte of
// [off, off+length), in memory and on disk, even a file another process
// wrote (it holds the same bytes: its name carries their CRC), so that
// the next read fetches them again. A reader calls it when bytes the
// cache served failed a check the cache cannot make itself: the memory's
// digest table. A fetch in flight is left alone; its bytes are new.
func (c *Cache) Uncache(object string, off, length int64) { c.drop(object, off, length, false) }

// Refuse is Uncache for bytes that failed the reader's check again once
// fetched anew: the store holds them damaged. Reads of their blocks then
// fail at once with ErrRefused for the failure holdoff (growing while
// they keep failing), rather than fetch the same bytes on every fault.
func (c *Cache) Refuse(object string, off, length int64) { c.drop(object, off, length, true) }

// ErrRefused is the error of reads of a block refused (see Refuse).
var ErrRefused = errors.New("the block's bytes from the store failed the reader's check")

// drop drops the blocks of object holding [off, off+length), and with
// refuse holds them off.
func (c *Cache) drop(object string, off, length int64, refuse bool) {
	if length <= 0 || off < 0 {
		return
	}
	var files []string
	var dropped []int64
	now := time.Now()
	c.mu.Lock()
	for idx := off / c.blockBytes; idx <= (off+length-1)/c.blockBytes; idx++ {
		key := blockKey{object, idx}
		if refuse && c.holdoff > 0 {
			c.noteFailureLocked(key, fmt.Errorf("block %d of %s: %w", idx, object, ErrRefused), now, true)
		}
		e := c.entries[key]
		if e == nil {
			continue
		}
		onDisk, path := e.onDisk, c.chunkPath(e)
		c.removeLocked(e)
		if onDisk {
			files = append(files, path)
		}
		c.stats.refused.Add(1)
		dropped = append(dropped, idx)
	}
	c.mu.Unlock()
	c.removeFiles(files)
	for _, idx := range dropped {
		c.log.Warn("chunk cache: dropped a block whose bytes failed the reader's check; it is fetched again",
			"object", object, "block", idx)
	}
}

// Cached reports whether block idx of object is cached now (in memory or
// on disk). Tests and benchmarks use it to check what a warming did.
func (c *Cache) Cached(object string, idx int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.entries[blockKey{object, idx}]
	return ok
}
