package snapcheck

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"warmstart/internal/integrity"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
	"warmstart/internal/untrusted"
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
	OpenStoreMemory(ctx context.Context) memdev.Lower
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
		rd, err := m.Open()
		if err != nil {
			return memoryFile{}, fmt.Errorf("open remote memory: %w", err)
		}
		return memoryFile{src: rd, size: rd.Size(), close: rd.Close}, nil
	}
	f, err := untrusted.Open(c.res.MemoryPath)
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

// memory reads the memory file once, computing its SHA-256 and fresh
// digest tables of both kinds, and compares them with the record and with
// the stored table that judges blocks best (stored[1], of SHA-256, when it
// can be used, else stored[0]). It returns the fresh tables of a memory
// file read to its end (zero ones otherwise). Only a cancelled context is
// returned as an error.
func (c *checker) memory(stored [2]*integrity.Table) (integrity.Tables, error) {
	rec := c.res.Record
	a := c.r.artifact(repository.MemoryFileName)
	a.Status = StatusOK
	mf, err := c.openMemory()
	if err != nil {
		openProblem(a, err)
		return integrity.Tables{}, nil
	}
	defer mf.close()
	if mf.size != rec.MemorySize {
		a.problem(KindSize, "%d bytes, the record says %d", mf.size, rec.MemorySize)
	}
	h := sha256.New()
	fresh := integrity.NewTables(mf.size)
	src := &pastFailures{src: mf.src, ctx: c.ctx}
	a.ReadBytes, err = stream(c.ctx, src, mf.size, io.MultiWriter(h, fresh), c.progress(a.Name, mf.size))
	if err != nil {
		return integrity.Tables{}, readFailed(c.ctx, a, mf.size, err)
	}
	if src.first != nil {
		// The hash and the tables are of zeros where reads failed: only
		// the block comparison still says something, where each failed
		// range shows as bad blocks next to any other bad block.
		a.ReadBytes -= src.failedBytes
		a.problem(KindRead, "%d bytes could not be read (%d reads failed), the first failed read at offset %d: %v",
			src.failedBytes, src.failures, src.firstAt, src.first)
		c.compareBlocks(a, stored, fresh)
		return integrity.Tables{}, nil
	}
	a.ReadSHA256 = hex.EncodeToString(h.Sum(nil))
	if a.ReadSHA256 != rec.MemorySHA256 {
		a.problem(KindSHA256, "the bytes hash to %s, the record says %s", a.ReadSHA256, rec.MemorySHA256)
	}
	c.compareBlocks(a, stored, fresh)
	return fresh, nil
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

// compareBlocks compares the memory file's fresh table with the stored
// one that judges blocks best and reports every block that differs.
func (c *checker) compareBlocks(a *Artifact, stored [2]*integrity.Table, fresh integrity.Tables) {
	table, read := stored[1], fresh.SHA256
	if table == nil {
		table, read = stored[0], fresh.CRC
	}
	c.judge = table
	if table == nil {
		if c.res.Record.MemoryDigests != nil || c.res.Record.MemorySHA256Digests != nil {
			a.Note = "blocks not compared: the digest table cannot be used"
		}
		return
	}
	compareWith(a, table, read)
}

// compareWith reports in a every block whose fresh digest (read) differs
// from table's, and returns their offsets.
func compareWith(a *Artifact, table *integrity.Table, read *integrity.Builder) []int64 {
	bad := table.Mismatches(read.Table())
	ranges := coalesce(bad, table.FileSize())
	a.Blocks = &Blocks{BlockBytes: integrity.BlockBytes, Checked: int64(table.Blocks()), Bad: int64(len(bad)), BadRanges: ranges}
	if len(bad) > 0 {
		a.problem(KindBadBlocks, "%d of %d blocks do not match the digest table, in %d ranges, the first at offset %d",
			len(bad), table.Blocks(), len(ranges), bad[0])
	}
	return bad
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

// addDigests attaches the fresh tables the snapshot lacks (wantsTables),
// when the memory file read as the record describes it. A refusal or a
// failed attach is a problem in the report; only a cancelled context is an
// error.
func (c *checker) addDigests(fresh integrity.Tables) error {
	rec := c.res.Record
	mem := c.r.artifact(repository.MemoryFileName)
	for _, st := range c.storedTables() {
		if st.desc != nil {
			continue
		}
		a := c.r.artifact(st.name)
		if fresh.CRC == nil || mem.ReadBytes != rec.MemorySize || mem.ReadSHA256 != rec.MemorySHA256 {
			a.problem(KindNotAdded, "digest table not added: %s does not match the record's SHA-256, "+
				"and a table of it would vouch for other bytes than the published ones", repository.MemoryFileName)
			continue
		}
		b := fresh.CRC
		if st.alg == integrity.SHA256 {
			b = fresh.SHA256
		}
		if err := c.addTable(a, b.Table().Encode()); err != nil {
			return err
		}
	}
	return nil
}

// addTable attaches one fresh table and notes it in a.
func (c *checker) addTable(a *Artifact, table []byte) error {
	desc, err := c.attach(table)
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
	if desc.Algorithm == string(integrity.CRC32C) {
		c.r.Unverified = false
		c.r.DigestsAdded = &desc
	} else {
		c.r.SHA256DigestsAdded = &desc
	}
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
