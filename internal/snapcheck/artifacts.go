package snapcheck

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"warmstart/internal/integrity"
	"warmstart/internal/manifest"
	"warmstart/internal/repository"
	"warmstart/internal/untrusted"
)

// vmState reads the VM state file whole and compares its size and SHA-256
// with the record. Only a cancelled context is returned.
func (c *checker) vmState() error {
	rec := c.res.Record
	a := c.r.artifact(repository.VMStateFileName)
	a.Status = StatusOK
	f, err := untrusted.Open(c.res.VMStatePath)
	if err != nil {
		openProblem(a, err)
		return nil
	}
	defer f.Close()
	size, err := fileSize(f)
	if err != nil {
		a.problem(KindRead, "%v", err)
		return nil
	}
	if size != rec.VMStateSize {
		a.problem(KindSize, "%d bytes, the record says %d", size, rec.VMStateSize)
	}
	h := sha256.New()
	a.ReadBytes, err = stream(c.ctx, f, size, h, c.progress(a.Name, size))
	if err != nil {
		return readFailed(c.ctx, a, size, err)
	}
	a.ReadSHA256 = hex.EncodeToString(h.Sum(nil))
	if a.ReadSHA256 != rec.VMStateSHA256 {
		a.problem(KindSHA256, "the bytes hash to %s, the record says %s", a.ReadSHA256, rec.VMStateSHA256)
	}
	return nil
}

// storedTable is one of the snapshot's digest tables as the record
// describes it and the repository gives it.
type storedTable struct {
	name string
	alg  integrity.Algorithm
	desc *repository.DigestsDescriptor
	path string
}

// storedTables are the CRC-32C table and the SHA-256 table, in that order.
func (c *checker) storedTables() [2]storedTable {
	rec := c.res.Record
	return [2]storedTable{
		{repository.DigestsFileName, integrity.CRC32C, rec.MemoryDigests, c.res.DigestsPath},
		{repository.SHA256DigestsFileName, integrity.SHA256, rec.MemorySHA256Digests, c.res.SHA256DigestsPath},
	}
}

// absentTable reports a table the record does not describe: a problem
// for the CRC-32C table of a record whose format always has one, a note
// otherwise.
func (c *checker) absentTable(a *Artifact, st storedTable) {
	rec := c.res.Record
	switch {
	case st.alg == integrity.CRC32C && rec.RequiresDigests():
		a.Status = StatusOK
		a.problem(KindMissing, "a record of format %d always has a digest table and this one has none: "+
			"it was changed after publish, and restores refuse it", rec.Format)
	case st.alg == integrity.CRC32C:
		a.Status = StatusAbsent
		a.Note = "unverified (no digest table): restores serve this snapshot's memory unchecked; " +
			"`warmstart snapshot verify --add-digests` adds one"
		c.r.Unverified = true
	default:
		a.Status = StatusAbsent
		a.Note = "no table of SHA-256 digests (published before there was one): the snapshot cannot be signed " +
			"and remote memory is checked by CRC-32C only; `warmstart snapshot verify --add-digests` adds one"
	}
}

// table reads a stored digest table, checks it against the record's
// descriptor and decodes it. It returns the table only when it can be
// trusted to judge the memory file's blocks.
func (c *checker) table(st storedTable) *integrity.Table {
	a := c.r.artifact(st.name)
	if st.desc == nil {
		c.absentTable(a, st)
		return nil
	}
	return readTable(a, st, c.res.Record.MemorySize)
}

// readTable reads the stored table st describes, of a file of fileSize
// bytes, into a's report.
func readTable(a *Artifact, st storedTable, fileSize int64) *integrity.Table {
	d := st.desc
	a.Status = StatusOK
	if st.path == "" {
		a.problem(KindMissing, "the repository gives no digest table file")
		return nil
	}
	data, err := untrusted.ReadBounded(st.path, d.Size)
	if err != nil {
		openProblem(a, err)
		return nil
	}
	got := repository.DescribeDigests(data)
	a.ReadBytes, a.ReadSHA256 = got.Size, got.SHA256
	if got.Size != d.Size {
		a.problem(KindSize, "%d bytes, the record says %d", got.Size, d.Size)
		return nil
	}
	if got.SHA256 != d.SHA256 {
		a.problem(KindSHA256, "the bytes hash to %s, the record says %s", got.SHA256, d.SHA256)
		return nil
	}
	t, err := integrity.Decode(data, fileSize)
	if err == nil && t.Algorithm() != st.alg {
		err = fmt.Errorf("a table of %s digests where one of %s belongs", t.Algorithm(), st.alg)
	}
	if err != nil {
		a.problem(KindInvalid, "%v", err)
		return nil
	}
	return t
}

// manifest reads the attached startup manifest and validates it as a
// restore would: size, SHA-256, encoding and layout.
func (c *checker) manifest() {
	rec := c.res.Record
	a := c.r.artifact(repository.ManifestFileName)
	m := rec.Manifest
	if m == nil {
		a.Status = StatusAbsent
		a.Note = "no startup manifest attached"
		return
	}
	a.Status = StatusOK
	if c.res.ManifestPath == "" {
		a.problem(KindMissing, "the repository gives no manifest file")
		return
	}
	data, err := manifest.ReadFile(c.res.ManifestPath)
	if errors.Is(err, manifest.ErrOversize) {
		a.problem(KindSize, "%v", err)
		return
	}
	if err != nil {
		openProblem(a, err)
		return
	}
	a.ReadBytes, a.ReadSHA256 = int64(len(data)), manifest.Digest(data)
	_, err = manifest.Verify(data, manifest.Descriptor{SHA256: m.SHA256, Size: m.Size}, rec.Layout)
	switch {
	case errors.Is(err, manifest.ErrSizeMismatch):
		a.problem(KindSize, "%d bytes, the record says %d", len(data), m.Size)
	case errors.Is(err, manifest.ErrDigestMismatch):
		a.problem(KindSHA256, "the bytes hash to %s, the record says %s", a.ReadSHA256, m.SHA256)
	case err != nil:
		a.problem(KindInvalid, "%v", err)
	}
}

// openProblem records why an artifact could not be opened or read.
func openProblem(a *Artifact, err error) {
	switch {
	case errors.Is(err, os.ErrNotExist):
		a.problem(KindMissing, "%v", err)
	case errors.Is(err, untrusted.ErrNotRegular):
		a.problem(KindNotRegular, "%v", err)
	case errors.Is(err, untrusted.ErrTooLarge):
		a.problem(KindSize, "%v", err)
	default:
		a.problem(KindRead, "%v", err)
	}
}

// readFailed records a failed read, unless the context ended, which ends
// the whole verification.
func readFailed(ctx context.Context, a *Artifact, expected int64, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		a.problem(KindSize, "it ended after %d of %d bytes", a.ReadBytes, expected)
		return nil
	}
	a.problem(KindRead, "read failed after %d bytes: %v", a.ReadBytes, err)
	return nil
}

func fileSize(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// stream reads size bytes of src from offset 0 into w, CopyBufferBytes at
// a time, and reports the running total to progress after each unit. A
// source that ends early is io.ErrUnexpectedEOF.
func stream(ctx context.Context, src io.ReaderAt, size int64, w io.Writer, progress func(int64)) (int64, error) {
	buf := make([]byte, CopyBufferBytes)
	var done int64
	for done < size {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		n, err := src.ReadAt(buf[:min(int64(len(buf)), size-done)], done)
		w.Write(buf[:n]) // hashes and table builders never fail
		done += int64(n)
		if progress != nil && n > 0 {
			progress(done)
		}
		if errors.Is(err, io.EOF) && done < size {
			return done, io.ErrUnexpectedEOF
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return done, err
		}
		if n == 0 && err == nil {
			return done, io.ErrUnexpectedEOF // a broken ReaderAt; never spin
		}
	}
	return done, nil
}
