package chunkcache

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// On-disk layout under the cache directory:
//
//	chunks/<object id>/<block bytes>-<index>-<length>-<crc32c>.blk   a block
//	chunks/<object id>/.tmp-<random>                                  a block being written
//
// A block's name is its own checksum record: the length and CRC-32C (hex)
// of its bytes as fetched. CRC-32C is hardware-accelerated (over 10 GB/s
// here), so checking a block costs far less than fetching it again; it
// catches torn writes, truncation and media corruption, not tampering.
const (
	chunksDirName = "chunks"
	chunkSuffix   = ".blk"
	tempPrefix    = ".tmp-"
	chunkFileMode = 0o444
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum is the CRC-32C of data.
func checksum(data []byte) uint32 { return crc32.Checksum(data, castagnoli) }

func (c *Cache) chunksDir() string { return filepath.Join(c.dir, chunksDirName) }

func (c *Cache) objectDir(object string) string { return filepath.Join(c.chunksDir(), object) }

func (c *Cache) chunkPath(e *entry) string {
	return filepath.Join(c.objectDir(e.key.object), chunkName(c.blockBytes, e.key.index, e.length, e.crc))
}

func chunkName(blockBytes, index, length int64, crc uint32) string {
	return fmt.Sprintf("%d-%d-%d-%08x%s", blockBytes, index, length, crc, chunkSuffix)
}

// parseChunkName reads a block file name; ok is false for anything else.
func parseChunkName(name string) (blockBytes, index, length int64, crc uint32, ok bool) {
	rest, found := strings.CutSuffix(name, chunkSuffix)
	if !found {
		return 0, 0, 0, 0, false
	}
	parts := strings.Split(rest, "-")
	if len(parts) != 4 || len(parts[3]) != 8 {
		return 0, 0, 0, 0, false
	}
	var nums [3]int64
	for i := range nums {
		v, err := strconv.ParseInt(parts[i], 10, 64)
		if err != nil || v < 0 || strconv.FormatInt(v, 10) != parts[i] {
			return 0, 0, 0, 0, false
		}
		nums[i] = v
	}
	sum, err := strconv.ParseUint(parts[3], 16, 32)
	if err != nil {
		return 0, 0, 0, 0, false
	}
	return nums[0], nums[1], nums[2], uint32(sum), nums[0] > 0 && nums[2] > 0
}

// index scans the blocks on disk into the index. alone says whether this
// is the only process with the directory open: only then is anything
// removed (see lock.go).
func (c *Cache) index(alone bool) error {
	discard := c.discard
	if !alone {
		discard = func(string, string) {} // another process may be writing them
	}
	found, err := c.scan(discard)
	if err != nil {
		return err
	}
	c.mu.Lock()
	for _, e := range found {
		e.foreign = !alone
		c.entries[e.key] = e
		e.elem = c.lru.PushFront(e)
		c.usedBytes += e.length
	}
	var victims []string
	if c.usedBytes > c.maxBytes {
		victims = c.evictLocked(0)
	}
	c.notePeakLocked()
	c.mu.Unlock()
	c.removeFiles(victims)
	return nil
}

// scan finds the blocks on disk, oldest first. It hands temporary files,
// blocks of another block size, and blocks whose size differs from the
// length in their name (a torn write) to discard. Contents are checked
// later, on first use.
func (c *Cache) scan(discard func(path, why string)) ([]*entry, error) {
	objects, err := os.ReadDir(c.chunksDir())
	if err != nil {
		return nil, err
	}
	var all []foundBlock
	for _, od := range objects {
		if !od.IsDir() || !validID(od.Name()) {
			continue
		}
		found, err := c.scanObject(od.Name(), discard)
		if err != nil {
			return nil, err
		}
		all = append(all, found...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mtime.Before(all[j].mtime) })
	out := make([]*entry, 0, len(all))
	seen := make(map[blockKey]bool, len(all))
	for _, f := range all {
		if seen[f.e.key] {
			// Two files for one block (a crash between writing a
			// refetched copy and removing the old one): keep one.
			discard(c.chunkPath(f.e), "duplicate")
			continue
		}
		seen[f.e.key] = true
		out = append(out, f.e)
	}
	return out, nil
}

// foundBlock is a block file scan found, with when it was last written.
type foundBlock struct {
	e     *entry
	mtime time.Time
}

// scanObject finds the blocks of one object on disk, as scan does.
func (c *Cache) scanObject(id string, discard func(path, why string)) ([]foundBlock, error) {
	dir := c.objectDir(id)
	files, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var found []foundBlock
	for _, f := range files {
		path := filepath.Join(dir, f.Name())
		if strings.HasPrefix(f.Name(), tempPrefix) {
			discard(path, "interrupted write")
			continue
		}
		bs, idx, length, crc, ok := parseChunkName(f.Name())
		if !ok || !f.Type().IsRegular() {
			continue
		}
		if bs != c.blockBytes || length > bs {
			discard(path, "other block size")
			continue
		}
		fi, err := f.Info()
		if err != nil {
			continue // removed under us
		}
		if fi.Size() != length {
			c.stats.corrupt.Add(1)
			discard(path, fmt.Sprintf("size %d, name says %d", fi.Size(), length))
			continue
		}
		e := &entry{key: blockKey{id, idx}, length: length, crc: crc, onDisk: true}
		found = append(found, foundBlock{e, fi.ModTime()})
	}
	return found, nil
}

func (c *Cache) discard(path, why string) {
	c.log.Warn("chunk cache: discarding block file", "path", path, "reason", why)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		c.log.Warn("chunk cache: remove block file", "path", path, "err", err)
	}
}

// persistLoop writes blocks handed over by insert until Close.
func (c *Cache) persistLoop() {
	for e := range c.persistQ {
		c.awaitWriteTurn()
		c.mu.Lock()
		live := c.entries[e.key] == e
		c.mu.Unlock()
		if !live {
			continue // evicted before it reached the disk
		}
		path := c.chunkPath(e)
		err := writeDurable(c.objectDir(e.key.object), path, e.data)
		c.mu.Lock()
		switch {
		case c.entries[e.key] != e:
			// Evicted while being written.
			c.mu.Unlock()
			if err == nil {
				c.removeFiles([]string{path})
			}
			continue
		case err != nil:
			c.removeLocked(e)
			failed, due := c.noteWriteFailureLocked()
			c.mu.Unlock()
			if due {
				c.log.Warn("chunk cache: write block; blocks that cannot be written are served, not kept",
					"path", path, "err", err, "failed_blocks", failed)
			}
			continue
		}
		e.onDisk, e.data = true, nil
		c.mu.Unlock()
	}
}

// noteWriteFailureLocked counts a block that could not be written and
// says whether to log it, with the failures since the last log: at most
// once a minute, since a full or broken disk fails every block a restore
// fetches (a warning per MiB of a 64 GiB guest otherwise). It needs mu.
func (c *Cache) noteWriteFailureLocked() (int, bool) {
	c.writeFailures++
	if time.Since(c.writeWarnedAt) < time.Minute {
		return 0, false
	}
	failed := c.writeFailures
	c.writeWarnedAt, c.writeFailures = time.Now(), 0
	return failed, true
}

// writeDurable writes data to path through a temporary file in dir that is
// fsynced before the rename, so path never names a partial block.
func writeDurable(dir, path string, data []byte) (err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, tempPrefix+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, chunkFileMode)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// errCorrupt marks a block file that failed its check.
var errCorrupt = errors.New("cached block failed its check")

// loadVerified reads a whole block file and checks it against its name.
func loadVerified(path string, length int64, crc uint32) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data := make([]byte, length)
	if _, err := io.ReadFull(f, data); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: %s is shorter than %d bytes", errCorrupt, path, length)
		}
		return nil, err
	}
	var extra [1]byte
	if n, _ := f.Read(extra[:]); n > 0 {
		return nil, fmt.Errorf("%w: %s is longer than %d bytes", errCorrupt, path, length)
	}
	if got := checksum(data); got != crc {
		return nil, fmt.Errorf("%w: %s has CRC-32C %08x, name says %08x", errCorrupt, path, got, crc)
	}
	return data, nil
}
