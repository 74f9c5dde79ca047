package s3

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"sync/atomic"

	"warmstart/internal/integrity"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
	"warmstart/internal/untrusted"
)

// Checking a startup pack against the memory's table.
//
// A frame's digest binds the frame to the pack's index and the index to
// the record's startup_pack, which no signature covers (signing.md:
// attachments are not signed) and which the node that attached the pack
// computed over the bytes it read through its own cache. So a frame that
// matches its digest is only as good as that node and that attach: the
// device's check of every block against the memory's SHA-256 table (in
// the signed core) is what ties the bytes to the publish. Checking the
// frame's digest as well hashed every startup byte twice.
//
// So a restore checks each frame, as it arrives, page by page against the
// memory's SHA-256 table at the memory offsets the frame's pages hold,
// and not against its digest: one hash per byte, against what the record
// binds. A frame that fails is refused as before (the read falls back to
// the chunks). Blocks the cache then holds in memory are prechecked for
// the device (integrity.Prechecker), which does not hash them again; a
// block the cache wrote to disk and reads back is checked by the device
// as ever.

// frameDigestBytes and chunkDigestBytes count the bytes this process
// hashed to check them against a pack frame's or a chunk's own digest (not
// a table): the tests compare them, with integrity.SHA256Hashed, to the
// startup set.
var frameDigestBytes, chunkDigestBytes atomic.Int64

// tableCheck checks a startup pack's logical bytes against the memory's
// table of SHA-256 digests.
type tableCheck struct {
	table *integrity.Table
	// order is the pack's spans in pack order.
	order []packSpan
	// matched is the last device table found equal to table.
	matched atomic.Pointer[integrity.Table]
}

// verify checks data, the pack's logical bytes from packOff, against the
// table at the memory offsets they hold: nil when every page matches.
func (c *tableCheck) verify(data []byte, packOff int64) error {
	end := packOff + int64(len(data))
	i := sort.Search(len(c.order), func(i int) bool { return c.order[i].packOff+c.order[i].length > packOff })
	covered := int64(0)
	for ; i < len(c.order) && c.order[i].packOff < end; i++ {
		sp := c.order[i]
		lo, hi := max(packOff, sp.packOff), min(end, sp.packOff+sp.length)
		if err := c.table.Verify(data[lo-packOff:hi-packOff], sp.memOff+lo-sp.packOff); err != nil {
			return err
		}
		covered += hi - lo
	}
	if covered != int64(len(data)) {
		return fmt.Errorf("pack bytes [%d, %d) are not all mapped to memory", packOff, end)
	}
	return nil
}

// matches reports whether t holds the digests c checks against: only
// then are the pack's blocks prechecked for a device checking with t.
func (c *tableCheck) matches(t *integrity.Table) bool {
	if t == nil {
		return false
	}
	if c.matched.Load() == t {
		return true
	}
	if !c.table.Equal(t) {
		return false
	}
	c.matched.Store(t)
	return true
}

// checkPackPages makes ps check its frames against rec's SHA-256 table
// (the file at path, which must be the one the record describes) instead
// of their digests, when the pack's pages line up with the table's blocks.
// It also renames ps's cache object: its blocks are checked against that
// table, which a pack of the same index read with another table (or
// with frame digests) must not pass for. Without a usable table the
// frames are checked against their digests, and nothing is prechecked.
func (r *Repo) checkPackPages(rec repository.Record, ps *packSource, path string) {
	d := rec.MemorySHA256Digests
	if ps == nil || d == nil || path == "" || !ps.pageAligned(rec.MemorySize) {
		return
	}
	data, err := untrusted.ReadBounded(path, d.Size)
	if err != nil {
		return
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != d.SHA256 {
		return // the restore's own check of the table fails and says why
	}
	t, err := integrity.Decode(data, rec.MemorySize)
	if err != nil || t.Algorithm() != integrity.SHA256 {
		return
	}
	id := sha256.Sum256([]byte(ps.obj.ID + " checked against the table " + d.SHA256))
	ps.obj.ID = "pack-t-" + hex.EncodeToString(id[:])
	ps.check = &tableCheck{table: t, order: ps.order}
}

// pageAligned reports whether every page of the pack lies whole in one
// frame and one span, at a table block of the memory: each span starts at
// a 4 KiB boundary of the memory and of the pack and is whole blocks (or
// ends at the end of the memory), and frames are whole blocks.
func (ps *packSource) pageAligned(memSize int64) bool {
	const b = integrity.BlockBytes
	if ps.frameBytes <= 0 || ps.frameBytes%b != 0 {
		return false
	}
	for _, sp := range ps.order {
		if sp.memOff%b != 0 || sp.packOff%b != 0 || (sp.length%b != 0 && sp.end() != memSize) {
			return false
		}
	}
	return true
}

// markPrechecked sets checked[k] for each block k of a read at off (a
// block boundary) that lies whole in memory [memOff, memOff+length), of a
// memory of size bytes.
func markPrechecked(checked []bool, off, memOff, length, size int64) {
	const b = integrity.BlockBytes
	for k := (memOff - off + b - 1) / b; k < int64(len(checked)); k++ {
		start := off + k*b
		if start < memOff || min(start+b, size) > memOff+length {
			break
		}
		checked[k] = true
	}
}

// A packed reader's pack pages are prechecked for the device.
var _ memdev.ContextPrechecker = (*packedReader)(nil)
