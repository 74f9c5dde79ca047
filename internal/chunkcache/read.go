package chunkcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// maxFailures is how many failed blocks are remembered before expired ones
// are dropped.
const maxFailures = 4096

// maxHoldoffDoublings caps the holdoff of a block whose fetches keep
// failing at 16 times the failure holdoff (4 s by default).
const maxHoldoffDoublings = 4

// maxBlockAttempts bounds how often one block of a read is looked up
// again: after its cached file vanished (evicted under the read), failed
// its check, or the fetch the read joined failed (say, a prefetch run that
// was stopped).
const maxBlockAttempts = 3

// Reader reads one object through the cache; it pins the object until
// Close. It is what a memory device serves from. Safe for concurrent use.
type Reader struct {
	c    *Cache
	obj  Object
	once sync.Once
}

// Open returns a Reader of obj and pins obj: none of its blocks is evicted
// while a Reader of it is open.
func (c *Cache) Open(obj Object) (*Reader, error) {
	if err := obj.validate(); err != nil {
		return nil, fmt.Errorf("open %s in chunk cache: %w", obj.ID, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("open %s in chunk cache: %w", obj.ID, ErrClosed)
	}
	c.pins[obj.ID]++
	return &Reader{c: c, obj: obj}, nil
}

// Size is the object's size.
func (r *Reader) Size() int64 { return r.obj.Size }

// Object is the object the Reader reads.
func (r *Reader) Object() Object { return r.obj }

// Close unpins the object. It is safe to call again.
func (r *Reader) Close() error {
	r.once.Do(func() { r.c.unpin(r.obj.ID) })
	return nil
}

// Uncache implements integrity.Uncacher: the blocks of the object holding
// [off, off+length) are dropped from the cache (see Cache.Uncache).
func (r *Reader) Uncache(off, length int64) { r.c.Uncache(r.obj.ID, off, length) }

// Refuse implements integrity.Uncacher (see Cache.Refuse).
func (r *Reader) Refuse(off, length int64) { r.c.Refuse(r.obj.ID, off, length) }

// ReadAt reads len(p) bytes at off (fewer only at the end of the object,
// with io.EOF), fetching missing blocks; each fetch is bounded by the
// cache's FetchTimeout. It never returns bytes it could not verify: on any
// failure it returns an error and n is 0.
func (r *Reader) ReadAt(p []byte, off int64) (int, error) {
	return r.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt that also ends when ctx does (the restore it
// reads for is over), with ctx's cause. Fetches another reader waits on
// go on for that reader.
func (r *Reader) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	n, _, err := r.ReadAtHeld(ctx, p, off)
	return n, err
}

// ReadAtHeld is ReadAtContext that also reports whether every byte it
// read came from a block this process fetched and has held in its own
// memory since (a fetch in flight, or a block not written to disk yet):
// bytes that passed the checks of the object's FetchFunc and that nobody
// could have changed since. A block read back from its file is not held,
// whatever its name's CRC-32C says.
func (r *Reader) ReadAtHeld(ctx context.Context, p []byte, off int64) (n int, held bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.c.fetchTimeout)
	defer cancel()
	if off < 0 {
		return 0, false, fmt.Errorf("read %s at %d: negative offset", r.obj.ID, off)
	}
	if off >= r.obj.Size {
		return 0, false, io.EOF
	}
	want := int(min(int64(len(p)), r.obj.Size-off))
	if want == 0 {
		return 0, false, nil
	}
	if err := r.c.begin(); err != nil {
		return 0, false, fmt.Errorf("read %s at %d: %w", r.obj.ID, off, err)
	}
	defer r.c.ops.Done()
	held, err = r.c.read(ctx, &r.obj, p[:want], off)
	if err != nil {
		return 0, false, fmt.Errorf("read %s [%d, %d): %w", r.obj.ID, off, off+int64(want), err)
	}
	if want < len(p) {
		return want, held, io.EOF
	}
	return want, held, nil
}

// slot is where a read finds one block.
type slot struct {
	err    error   // failed recently (failure holdoff)
	data   []byte  // in memory (not yet written, or just verified)
	path   string  // on disk, verified
	verify *entry  // on disk, not yet checked since Open
	fl     *flight // being fetched
	joined bool    // fl was started by someone else, whose job the read holds
}

// read fills dst with the object's bytes at off, and reports whether every
// block it took them from was held in memory (see ReadAtHeld). The missing
// blocks of the whole span are registered as flights first, and
// consecutive ones fetched with one ranged GET, so a read across a block
// boundary costs one request.
//
// The read's GETs are a job of their own (job.go): when ctx ends, the read
// returns at once, and its GETs go on while another read waits on one of
// their blocks; the flights it joined go on for their other readers.
func (c *Cache) read(ctx context.Context, obj *Object, dst []byte, off int64) (inMemory bool, err error) {
	first := off / c.blockBytes
	last := (off + int64(len(dst)) - 1) / c.blockBytes
	slots := make([]slot, last-first+1)
	job := newFetchJob(ctx)
	held := []*fetchJob{job}
	defer func() {
		c.awaitJob(ctx, job)
		c.letGo(ctx, held)
	}()
	fresh := false
	c.mu.Lock()
	for i := range slots {
		slots[i] = c.lookupLocked(obj.ID, first+int64(i), job)
		if slots[i].joined {
			held = append(held, slots[i].fl.job)
		}
		fresh = fresh || (slots[i].fl != nil && !slots[i].joined)
	}
	c.mu.Unlock()
	if fresh {
		// The fresh flights may not be consecutive (a cached block between
		// two misses); fetch each consecutive group with its own GET.
		c.fetchGroups(job, obj, first, slots)
	}

	inMemory = true
	for i := range slots {
		idx := first + int64(i)
		blockStart := idx * c.blockBytes
		lo := max(off, blockStart)
		hi := min(off+int64(len(dst)), blockStart+c.blockLength(obj.Size, idx))
		part := dst[lo-off : hi-off]
		s := slots[i]
		for attempt := 1; ; attempt++ {
			var again bool
			again, err = c.copyFrom(ctx, obj, idx, s, part, lo-blockStart)
			if !again || attempt == maxBlockAttempts || ctx.Err() != nil {
				break
			}
			s = c.lookupAndFetch(job, obj, idx)
			if s.joined {
				held = append(held, s.fl.job)
			}
		}
		if err != nil {
			return false, err
		}
		inMemory = inMemory && (s.data != nil || s.fl != nil)
	}
	return inMemory, nil
}

// fetchGroups starts fetching the consecutive runs of fresh (not joined)
// flights in slots, whose first block is first, each with one GET of job,
// concurrently. Readers wait on the flights.
func (c *Cache) fetchGroups(job *fetchJob, obj *Object, first int64, slots []slot) {
	for i := 0; i < len(slots); {
		if slots[i].fl == nil || slots[i].joined {
			i++
			continue
		}
		j := i
		var group []*flight
		for j < len(slots) && slots[j].fl != nil && !slots[j].joined {
			group = append(group, slots[j].fl)
			j++
		}
		start := first + int64(i)
		c.runJob(job, func(ctx context.Context) { c.fetchRun(ctx, obj, start, group, nil) })
		i = j
	}
}

// lookupLocked finds block idx of object, registering a flight of job
// (which the caller must fetch) when it is neither cached nor being
// fetched. Joining a flight holds its job, which the caller lets go of.
func (c *Cache) lookupLocked(object string, idx int64, job *fetchJob) slot {
	key := blockKey{object, idx}
	if e := c.entries[key]; e != nil {
		c.touchLocked(e)
		c.stats.hits.Add(1)
		switch {
		case e.data != nil:
			return slot{data: e.data}
		case e.verified:
			return slot{path: c.chunkPath(e)}
		default:
			return slot{verify: e}
		}
	}
	if f := c.flights[key]; f != nil && !f.job.abandoned() {
		c.stats.joins.Add(1)
		f.job.holdLocked()
		return slot{fl: f, joined: true}
	}
	// A failure whose holdoff is over stays noted: its strikes lengthen
	// the holdoff if this fetch fails too.
	if fail, ok := c.failures[key]; ok && time.Now().Before(fail.until) {
		c.stats.heldOff.Add(1)
		return slot{err: fail.err}
	}
	// A flight whose every reader gave up is ending: this read replaces it
	// with its own (the ending one then leaves c.flights alone).
	f := newFlight(job)
	c.flights[key] = f
	c.stats.misses.Add(1)
	return slot{fl: f}
}

// lookupAndFetch looks block idx up again and starts fetching it as part
// of job if needed.
func (c *Cache) lookupAndFetch(job *fetchJob, obj *Object, idx int64) slot {
	c.mu.Lock()
	s := c.lookupLocked(obj.ID, idx, job)
	c.mu.Unlock()
	if s.fl != nil && !s.joined {
		c.runJob(job, func(ctx context.Context) { c.fetchRun(ctx, obj, idx, []*flight{s.fl}, nil) })
	}
	return s
}

// copyFrom copies block idx's bytes at inBlock into part from s. again
// reports that the block must be looked up anew: its file went away, it
// failed its check, or the fetch it joined failed.
func (c *Cache) copyFrom(ctx context.Context, obj *Object, idx int64, s slot, part []byte, inBlock int64) (again bool, err error) {
	switch {
	case s.err != nil:
		return false, s.err
	case s.data != nil:
		copy(part, s.data[inBlock:])
		return false, nil
	case s.verify != nil:
		data, err := loadVerified(c.chunkPath(s.verify), s.verify.length, s.verify.crc)
		if err != nil {
			c.dropBroken(s.verify, err)
			return true, err
		}
		c.mu.Lock()
		s.verify.verified = true
		c.mu.Unlock()
		copy(part, data[inBlock:])
		return false, nil
	case s.path != "":
		f, err := os.Open(s.path)
		if errors.Is(err, os.ErrNotExist) {
			c.forget(obj.ID, idx, s.path)
			return true, err
		}
		if err != nil {
			return false, err
		}
		defer f.Close()
		n, err := f.ReadAt(part, inBlock)
		if n == len(part) {
			return false, nil
		}
		if err == nil || errors.Is(err, io.EOF) {
			// Verified once, shorter now: the file was changed under us.
			err = fmt.Errorf("%w: %s is shorter than verified", errCorrupt, s.path)
			c.forget(obj.ID, idx, s.path)
			c.stats.corrupt.Add(1)
			return true, err
		}
		return false, err
	default:
		data, err := s.fl.wait(ctx, inBlock+int64(len(part)))
		if err != nil {
			return s.joined && ctx.Err() == nil, err
		}
		copy(part, data[inBlock:])
		return false, nil
	}
}

// dropBroken discards a block file that failed its check.
func (c *Cache) dropBroken(e *entry, why error) {
	if !errors.Is(why, errCorrupt) && !errors.Is(why, os.ErrNotExist) {
		return // an I/O error says nothing about the bytes; keep the file
	}
	c.mu.Lock()
	// Concurrent reads of one unchecked block each find it broken; the
	// one that removes it counts it.
	first := c.entries[e.key] == e
	path := c.removeLocked(e)
	c.mu.Unlock()
	if errors.Is(why, errCorrupt) && first {
		c.stats.corrupt.Add(1)
		c.log.Warn("chunk cache: discarding corrupt block", "err", why)
	}
	if path != "" {
		c.removeFiles([]string{path})
	}
}

// forget drops the index entry of block idx if it still names path.
func (c *Cache) forget(object string, idx int64, path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[blockKey{object, idx}]; e != nil && e.onDisk && c.chunkPath(e) == path {
		c.removeLocked(e)
	}
}

// fetchRun fetches blocks first .. first+len(flights)-1 of obj with one
// ranged GET and resolves their flights in order, as each block arrives,
// so a reader waiting on an early block of a long run is not held up by
// the rest. w is the warming that fetches the run, nil for a demand read.
func (c *Cache) fetchRun(ctx context.Context, obj *Object, first int64, flights []*flight, w *Warming) error {
	off := first * c.blockBytes
	end := min(obj.Size, (first+int64(len(flights)))*c.blockBytes)
	c.stats.fetches.Add(1)
	began := time.Now()
	body, err := obj.Fetch(ctx, off, end-off)
	c.onFetch.observe(time.Since(began), err)
	if err != nil {
		c.stats.fetchErrors.Add(1)
		err = fmt.Errorf("fetch [%d, %d): %w", off, end, err)
		c.failFlights(obj.ID, first, flights, err, holdsOff(ctx, err))
		return err
	}
	defer body.Close()
	for i, f := range flights {
		idx := first + int64(i)
		buf := make([]byte, c.blockLength(obj.Size, idx))
		if err := f.receive(body, buf); err != nil {
			c.stats.fetchErrors.Add(1)
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				err = ErrShortFetch
			}
			err = fmt.Errorf("fetch [%d, %d): block %d: %w", off, end, idx, err)
			c.failFlights(obj.ID, idx, flights[i:], err, holdsOff(ctx, err))
			return err
		}
		c.stats.fetchedBytes.Add(uint64(len(buf)))
		if w != nil {
			c.stats.prefetchedBlocks.Add(1)
			w.noteBlock()
		}
		c.complete(blockKey{obj.ID, idx}, f, buf)
	}
	return nil
}

// complete indexes a fetched block, then wakes its waiters, then hands the
// block to the disk writers. Indexing first means a lookup always finds the
// block either cached or in flight, never neither.
func (c *Cache) complete(key blockKey, f *flight, data []byte) {
	crc := checksum(data)
	c.mu.Lock()
	e, victims, full := c.insertLocked(key, data, crc)
	if c.flights[key] == f {
		delete(c.flights, key)
	}
	if len(c.failures) > 0 {
		// The store answers again: end the holdoff of the object's blocks.
		for k, f := range c.failures {
			if k.object == key.object && !f.refused {
				delete(c.failures, k)
			}
		}
	}
	c.mu.Unlock()
	f.data = data
	close(f.done)
	c.removeFiles(victims)
	if full {
		c.warnNotKept(key.object)
	}
	if e != nil {
		// Blocks while the writers are behind: that bounds the blocks held
		// in memory. Close waits for every fetch before closing the queue.
		c.persistQ <- e
		c.noteQueued()
	}
}

// failFlights fails the flights of blocks first.. with err. With holdoff
// (not for a cancellation: a stopped warming, readers that gave up; see
// holdsOff), the blocks then fail demand reads at once for the failure
// holdoff.
func (c *Cache) failFlights(object string, first int64, flights []*flight, err error, holdoff bool) {
	holdoff = holdoff && c.holdoff > 0
	now := time.Now()
	c.mu.Lock()
	if holdoff && len(c.failures) > maxFailures {
		c.pruneFailuresLocked()
	}
	for i, f := range flights {
		key := blockKey{object, first + int64(i)}
		if c.flights[key] == f {
			delete(c.flights, key)
		}
		if holdoff {
			c.noteFailureLocked(key, err, now, false)
		}
		f.err = err
	}
	c.mu.Unlock()
	for _, f := range flights {
		close(f.done)
	}
}

// noteFailureLocked starts key's failure holdoff with err: twice as long
// as the last one if that ended lately (the block keeps failing), the
// configured holdoff if it ended long ago or there was none. refused
// marks bytes the reader refused (see Refuse).
func (c *Cache) noteFailureLocked(key blockKey, err error, now time.Time, refused bool) {
	strikes := 1
	if last, ok := c.failures[key]; ok && now.Sub(last.until) < c.holdoff<<maxHoldoffDoublings {
		strikes = last.strikes + 1
	}
	c.failures[key] = failure{err: err, until: now.Add(c.holdoff << min(strikes-1, maxHoldoffDoublings)),
		strikes: strikes, refused: refused}
}

// pruneFailuresLocked drops failures whose holdoff has passed.
func (c *Cache) pruneFailuresLocked() {
	now := time.Now()
	for k, f := range c.failures {
		if now.After(f.until) {
			delete(c.failures, k)
		}
	}
}

// Load fetches the blocks of obj that hold [off, off+length) into the
// cache, unless they are cached or in flight, without pinning obj. It is
// for background fills: a fill must not keep the blocks of the objects
// restores are reading from being cached, as a pin would.
func (c *Cache) Load(ctx context.Context, obj Object, off, length int64) error {
	if err := obj.validate(); err != nil {
		return fmt.Errorf("load %s: %w", obj.ID, err)
	}
	if off < 0 || length <= 0 || off+length > obj.Size {
		return fmt.Errorf("load %s [%d, +%d): outside the %d-byte object", obj.ID, off, length, obj.Size)
	}
	if err := c.begin(); err != nil {
		return fmt.Errorf("load %s: %w", obj.ID, err)
	}
	defer c.ops.Done()
	if _, err := c.read(ctx, &obj, make([]byte, length), off); err != nil {
		return fmt.Errorf("load %s [%d, %d): %w", obj.ID, off, off+length, err)
	}
	return nil
}

// FreeBytes is how many more bytes fit under the bound without evicting.
func (c *Cache) FreeBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxBytes - c.usedBytes
}
