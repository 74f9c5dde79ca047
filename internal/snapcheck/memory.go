package snapcheck

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"warmstart/internal/fsx"
	"warmstart/internal/integrity"
	"warmstart/internal/repository"
)

// memoryFile is the memory file opened for one pass.
type memoryFile struct {
	src   io.ReaderAt
	size  int64
	close func() error
}

// storeMemory is a remote memory source that can read straight from its
// store, past the node's cache (s3's memory source).
type storeMemory interface {
	OpenStoreMemory(ctx context.Context) repository.MemoryReader
}

// openMemory opens the local memory file, or a reader of a remote one:
// straight from the store where the source can, so that what this node
// cached does not stand in for what the store holds.
func (c *checker) openMemory() (memoryFile, error) {
	if sm, ok := c.res.Memory.(storeMemory); ok {
		rd := sm.OpenStoreMemory(c.ctx)
		return memoryFile{src: rd, size: rd.Size(), close: rd.Close}, nil
	}
	if m := c.res.Memory; m != nil {
		rd, err := m.OpenMemory()
		if err != nil {
			return memoryFile{}, fmt.Errorf("open remote memory: %w", err)
		}
		return memoryFile{src: rd, size: rd.Size(), close: rd.Close}, nil
	}
	f, err := fsx.OpenRegular(c.res.MemoryPath)
	if err != nil {
		return memoryFile{}, err
	}
	size, err := fileSize(f)
	if err != nil {
		f.Close()
		return memoryFile{}, err
	}
	return memoryFile{src: f, size: size, close: f.Close}, nil
}

// freshTables are the tables a pass over the memory file builds: one of
// the stored table's digest to compare it with, and one of
// integrity.Default's for AddDigests (the same one when they agree).
type freshTables struct{ compare, add *integrity.Builder }

func newFreshTables(stored *integrity.Table, size int64) freshTables {
	add := integrity.NewBuilder(integrity.Default, size)
	if stored == nil || stored.Algorithm() == integrity.Default {
		return freshTables{add, add}
	}
	return freshTables{integrity.NewBuilder(stored.Algorithm(), size), add}
}

// writer feeds h and the tables.
func (f freshTables) writer(h io.Writer) io.Writer {
	if f.compare == f.add {
		return io.MultiWriter(h, f.add)
	}
	return io.MultiWriter(h, f.compare, f.add)
}

// memory reads the memory file once, computing its SHA-256 and fresh
// digest tables, and compares them with the record and with the stored
// table (when there is one to trust). It returns the fresh table of
// integrity.Default's digest of a memory file read to its end. Only a
// cancelled context is returned as an error.
func (c *checker) memory(stored *integrity.Table) (*integrity.Table, error) {
	rec := c.res.Record
	a := c.r.artifact(repository.MemoryFileName)
	a.Status = StatusOK
	mf, err := c.openMemory()
	if err != nil {
		openProblem(a, err)
		return nil, nil
	}
	defer mf.close()
	if mf.size != rec.MemorySize {
		a.problem(KindSize, "%d bytes, the record says %d", mf.size, rec.MemorySize)
	}
	h := sha256.New()
	tables := newFreshTables(stored, mf.size)
	src := &pastFailures{src: mf.src, ctx: c.ctx}
	a.ReadBytes, err = stream(c.ctx, src, mf.size, tables.writer(h), c.progress(a.Name, mf.size))
	if err != nil {
		return nil, readFailed(c.ctx, a, mf.size, err)
	}
	fresh := tables.compare.Table()
	if src.first != nil {
		// The hash and the table are of zeros where reads failed: only
		// the block comparison still says something, where each failed
		// range shows as bad blocks next to any other bad block.
		a.ReadBytes -= src.failedBytes
		a.problem(KindRead, "%d bytes could not be read (%d reads failed), the first failed read at offset %d: %v",
			src.failedBytes, src.failures, src.firstAt, src.first)
		c.compareBlocks(a, stored, fresh)
		return nil, nil
	}
	a.ReadSHA256 = hex.EncodeToString(h.Sum(nil))
	if a.ReadSHA256 != rec.MemorySHA256 {
		a.problem(KindSHA256, "the bytes hash to %s, the record says %s", a.ReadSHA256, rec.MemorySHA256)
	}
	c.compareBlocks(a, stored, fresh)
	return tables.add.Table(), nil
}

// pastFailures reads src and goes on past a read that fails on a
// damaged part of it: it serves zeros for the rest of that read and notes
// it. A remote memory fails by the chunk (a chunk object missing or
// corrupt), and an operator wants every damaged part of it from one
// pass, not only the first. Any other failure (a store that does not
// answer) ends the pass as before: going on would wait out every block.
type pastFailures struct {
	src io.ReaderAt
	ctx context.Context

	failures, failedBytes, firstAt int64
	first                          error
}

// damagedPart reports whether err is about the bytes of one part (refused
// by their digest, or an object missing), not about reaching the store.
func damagedPart(err error) bool {
	return errors.Is(err, repository.ErrIntegrity) || errors.Is(err, repository.ErrNotFound) || errors.Is(err, integrity.ErrCorrupt)
}

func (p *pastFailures) ReadAt(buf []byte, off int64) (int, error) {
	n, err := p.src.ReadAt(buf, off)
	if err == nil || errors.Is(err, io.EOF) || p.ctx.Err() != nil || !damagedPart(err) {
		return n, err
	}
	if p.first == nil {
		p.first, p.firstAt = err, off+int64(n)
	}
	p.failures++
	p.failedBytes += int64(len(buf) - n)
	clear(buf[n:])
	return len(buf), nil
}

// compareBlocks compares the memory file's fresh table with the stored one
// and reports every block that differs.
func (c *checker) compareBlocks(a *Artifact, stored, fresh *integrity.Table) {
	if stored == nil {
		if c.res.Record.MemoryDigests != nil {
			a.Note = "blocks not compared: the digest table cannot be used"
		}
		return
	}
	bad := stored.Mismatches(fresh)
	ranges := coalesce(bad, stored.FileSize())
	a.Blocks = &Blocks{BlockBytes: integrity.BlockBytes, Checked: int64(stored.Blocks()), Bad: int64(len(bad)), BadRanges: ranges}
	if len(bad) > 0 {
		a.problem(KindBadBlocks, "%d of %d blocks do not match the digest table, in %d ranges, the first at offset %d",
			len(bad), stored.Blocks(), len(ranges), bad[0])
	}
}

// coalesce merges the offsets of bad blocks, in increasing order, into
// runs of consecutive blocks. The last block of the file may be short.
func coalesce(offsets []int64, fileSize int64) []Range {
	ranges := []Range{}
	for _, off := range offsets {
		if n := len(ranges); n > 0 && ranges[n-1].Offset+ranges[n-1].Blocks*integrity.BlockBytes == off {
			ranges[n-1].Blocks++
			continue
		}
		ranges = append(ranges, Range{Offset: off, Blocks: 1})
	}
	for i := range ranges {
		end := min(ranges[i].Offset+ranges[i].Blocks*integrity.BlockBytes, fileSize)
		ranges[i].Length = end - ranges[i].Offset
	}
	return ranges
}

// addDigests attaches the fresh table to a snapshot that has none or one
// of CRC-32C digests (wantsTable), when the memory file read as the
// record describes it. A refusal or a failed
// attach is a problem in the report; only a cancelled context is an error.
func (c *checker) addDigests(fresh *integrity.Table) error {
	rec := c.res.Record
	mem := c.r.artifact(repository.MemoryFileName)
	a := c.r.artifact(repository.DigestsFileName)
	if fresh == nil || mem.ReadBytes != rec.MemorySize || mem.ReadSHA256 != rec.MemorySHA256 {
		a.problem(KindNotAdded, "digest table not added: %s does not match the record's SHA-256, "+
			"and a table of it would vouch for other bytes than the published ones", repository.MemoryFileName)
		return nil
	}
	desc, err := c.attach(fresh.Encode())
	if err != nil {
		if c.ctx.Err() != nil {
			return c.ctx.Err()
		}
		a.problem(KindAttach, "digest table not added: %v", err)
		return nil
	}
	a.Status, a.Size, a.SHA256 = StatusAdded, desc.Size, desc.SHA256
	a.ReadBytes, a.ReadSHA256 = desc.Size, desc.SHA256
	a.Note = "added: computed from memory.bin, whose SHA-256 matches the record"
	c.r.Unverified = false
	c.r.DigestsAdded = &desc
	return nil
}

// attach attaches an encoded table under a lease of its own.
func (c *checker) attach(table []byte) (repository.DigestsDescriptor, error) {
	lease, err := c.repo.LeaseExisting(c.ctx, c.res.Record.ID)
	if err != nil {
		return repository.DigestsDescriptor{}, err
	}
	desc, err := c.repo.AttachDigests(c.ctx, lease, table)
	return desc, errors.Join(err, lease.End())
}
