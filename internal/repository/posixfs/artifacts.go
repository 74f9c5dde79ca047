package posixfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"warmstart/internal/durable"
	"warmstart/internal/integrity"
	"warmstart/internal/repository"
	"warmstart/internal/untrusted"
)

// Importing artifacts: by default a copy, so that nothing the publisher
// writes later can change a published snapshot. Where the file system can
// share extents (FICLONE: btrfs, XFS) the copy is a reflink, which moves no
// bytes and is still a separate inode; elsewhere it is a byte copy whose
// SHA-256 is computed while copying and again from the stored file after
// fsync, with the copy's pages dropped from the page cache first so the
// second pass reads what the disk holds rather than what was written. A
// hard link only when the publisher asks for one (PublishRequest.Link) and
// promises never to write the source again; the shared inode is then made
// read-only so that promise is kept by the kernel for anyone but root.

// CopyBufferBytes is the read and write unit of copies and hashing.
const CopyBufferBytes = 1 << 20

// artifactFileMode is read-only: nothing rewrites an artifact in place.
const artifactFileMode = 0o444

// storedArtifact is what the record says about one imported artifact.
type storedArtifact struct {
	size   int64
	sha256 string
	// tables are the per-block digest tables, when the import computed
	// them.
	tables repository.DigestTables
}

func (a storedArtifact) stored() repository.StoredArtifact {
	return repository.StoredArtifact{Size: a.size, SHA256: a.sha256}
}

// importSpec names one artifact to import.
type importSpec struct {
	src, name string
	// size is the source's size when Publish checked it; the stored file
	// must have it.
	size      int64
	tempFault string
	// digests makes the import compute the per-block digest table in the
	// pass that hashes the bytes.
	digests bool
	link    bool
	// field names the publish request field src came in
	// (repository.FieldVMState, FieldMemory), if it came in one: a source
	// found changed while copied is then that field's fault.
	field string
}

// importArtifact stores spec.src as spec.name in the snapshot directory dir.
func (r *Repo) importArtifact(ctx context.Context, dir string, spec importSpec, progress func(repository.ImportProgress)) (storedArtifact, error) {
	tmp := filepath.Join(dir, tempName(spec.name))
	committed := false
	defer func() {
		if !committed {
			os.Remove(tmp)
		}
	}()
	report := func(step string, done int64) {
		if progress != nil {
			progress(repository.ImportProgress{Artifact: spec.name, Step: step, DoneBytes: done, TotalBytes: spec.size})
		}
	}
	got, err := r.store(ctx, spec, tmp, report)
	if err != nil {
		return storedArtifact{}, err
	}
	if got.size != spec.size {
		return storedArtifact{}, &repository.IntegrityError{Artifact: spec.name, Want: strconv.FormatInt(spec.size, 10) + " bytes", Got: strconv.FormatInt(got.size, 10) + " bytes"}
	}
	r.fault(spec.tempFault)
	final := filepath.Join(dir, spec.name)
	if err := os.Rename(tmp, final); err != nil {
		return storedArtifact{}, fmt.Errorf("rename %s to %s: %w", tmp, final, err)
	}
	committed = true
	return got, nil
}

// store puts the bytes of spec.src at tmp: a hard link when asked, else a
// reflink where the file system supports it, else a verified copy.
func (r *Repo) store(ctx context.Context, spec importSpec, tmp string, report func(string, int64)) (storedArtifact, error) {
	hashed := func(n int64) { report(repository.StepHash, n) }
	if spec.link && !r.opts.ForceCopy {
		if err := linkReadOnly(spec.src, tmp); err != nil {
			return storedArtifact{}, err
		}
		// The source may not have been synced by the VMM that wrote it.
		return hashFile(ctx, tmp, true, spec.digests, hashed)
	}
	if !r.opts.ForceCopy {
		cloned, err := reflink(spec.src, tmp)
		if err != nil {
			return storedArtifact{}, err
		}
		if cloned {
			return hashFile(ctx, tmp, true, spec.digests, hashed)
		}
	}
	return r.copyVerified(ctx, spec, tmp, report)
}

// linkReadOnly hard-links the file src names to dst, following a symlink
// (link(2) itself would link the symlink, leaving the store pointing
// outside itself), and makes the shared inode read-only by taking its
// write bits (and any set-id bit) away. Nothing is added: the inode is
// still the source's, and a file its owner kept private must not become
// readable by others because a snapshot links it (the repository reads it
// as root or as its owner).
func linkReadOnly(src, dst string) error {
	if err := unix.Linkat(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.AT_SYMLINK_FOLLOW); err != nil {
		if errors.Is(err, unix.EXDEV) {
			// The request's to change, not the store's: say how.
			return &repository.FieldError{Field: repository.FieldLink, Err: fmt.Errorf(
				"%w: hard-link %s into the store: %w: a hard link cannot cross file systems (link works only "+
					"on the store's file system); import without --link to copy it", repository.ErrInvalidRequest, src, err)}
		}
		return fmt.Errorf("hard-link %s into the store: %w", src, err)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		return fmt.Errorf("make linked %s read-only: %w", src, err)
	}
	if err := os.Chmod(dst, fi.Mode().Perm()&^0o222); err != nil {
		return fmt.Errorf("make linked %s read-only: %w", src, err)
	}
	return nil
}

// reflink makes dst a clone of src's extents. It reports false, leaving no
// dst behind, where the file systems cannot clone (different file systems,
// or one without shared extents), so the caller copies instead.
func reflink(src, dst string) (bool, error) {
	in, err := os.Open(src)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, artifactFileMode)
	if err != nil {
		return false, fmt.Errorf("create %s: %w", dst, err)
	}
	cerr := unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	if err := out.Close(); err != nil && cerr == nil {
		return false, fmt.Errorf("close %s: %w", dst, err)
	}
	if cerr != nil {
		os.Remove(dst)
		return false, nil
	}
	return true, nil
}

// copyVerified copies spec.src to the new file dst and checks that dst
// reads back, after fsync, as the bytes read from the source.
func (r *Repo) copyVerified(ctx context.Context, spec importSpec, dst string, progress func(step string, done int64)) (storedArtifact, error) {
	in, err := os.Open(spec.src)
	if err != nil {
		return storedArtifact{}, fmt.Errorf("open %s: %w", spec.src, err)
	}
	defer in.Close()
	before, err := changeStamp(in)
	if err != nil {
		return storedArtifact{}, err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, artifactFileMode)
	if err != nil {
		return storedArtifact{}, fmt.Errorf("create %s: %w", dst, err)
	}
	h := sha256.New()
	sparse := &holeWriter{f: out}
	sinks := []io.Writer{sparse, h}
	var tables *integrity.Tables
	if spec.digests {
		t := integrity.NewTables(spec.size)
		tables, sinks = &t, append(sinks, t)
	}
	n, err := copyContext(ctx, io.MultiWriter(sinks...), in, func(n int64) { progress(repository.StepCopy, n) })
	if err != nil {
		out.Close()
		return storedArtifact{}, fmt.Errorf("copy %s to %s: %w", spec.src, dst, err)
	}
	// Zero pages were skipped, not written: the size the trailing ones
	// give the file is set here.
	if err := out.Truncate(n); err != nil {
		out.Close()
		return storedArtifact{}, fmt.Errorf("size %s to %d bytes: %w", dst, n, err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return storedArtifact{}, fmt.Errorf("fsync %s: %w", dst, err)
	}
	// Written pages are clean after fsync; dropping them makes the
	// verification pass read from the device.
	_ = unix.Fadvise(int(out.Fd()), 0, 0, unix.FADV_DONTNEED)
	if err := out.Close(); err != nil {
		return storedArtifact{}, fmt.Errorf("close %s: %w", dst, err)
	}
	if r.afterCopy != nil {
		r.afterCopy(dst)
	}
	if err := unchangedSince(in, spec, before); err != nil {
		return storedArtifact{}, err
	}
	want := storedArtifact{size: n, sha256: hex.EncodeToString(h.Sum(nil))}
	got, err := hashFile(ctx, dst, false, false, func(n int64) { progress(repository.StepVerify, n) })
	if err != nil {
		return storedArtifact{}, err
	}
	if got.size != want.size || got.sha256 != want.sha256 {
		return storedArtifact{}, &repository.IntegrityError{Artifact: spec.name, Want: want.sha256, Got: got.sha256}
	}
	if tables != nil {
		got.tables = repository.EncodeTables(*tables)
	}
	return got, nil
}

// holePage is the unit holeWriter looks for zeros in: the host page, the
// block of the file systems that keep holes.
const holePage = 4096

var zeroPage [holePage]byte

// holeWriter writes a stream into a new, empty file and leaves every whole
// zero page of it a hole instead of writing it, so a memory file that is
// mostly holes (a large guest that touched little of its memory) is stored
// as sparse as it came, not as its whole size of zeros on disk. Reading a
// hole gives zeros, so the copy's bytes are the same. The caller truncates
// the file to the stream's length at the end, for trailing zero pages.
type holeWriter struct {
	f   *os.File
	off int64
}

func (w *holeWriter) Write(p []byte) (int, error) {
	for i := 0; i < len(p); {
		end := min(i+holePage, len(p))
		if bytes.Equal(p[i:end], zeroPage[:end-i]) {
			i = end
			continue
		}
		// A run of pages with data is written in one call.
		for end < len(p) {
			next := min(end+holePage, len(p))
			if bytes.Equal(p[end:next], zeroPage[:next-end]) {
				break
			}
			end = next
		}
		if _, err := w.f.WriteAt(p[i:end], w.off+int64(i)); err != nil {
			return i, err
		}
		i = end
	}
	w.off += int64(len(p))
	return len(p), nil
}

// stamp is what tells whether a file was written: its size, and its
// modification and status change times (the latter no tool can set
// back).
type stamp struct {
	size         int64
	mtime, ctime unix.Timespec
}

// changeStamp reads f's stamp.
func changeStamp(f *os.File) (stamp, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return stamp{}, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return stamp{size: st.Size, mtime: st.Mtim, ctime: st.Ctim}, nil
}

// unchangedSince refuses a copy of a source written while it was read:
// its bytes mix the file before and after the write, which no moment of
// the guest held, yet match the digests computed from what was read. The
// writer is the caller's to stop: the refusal names the request field the
// source came in, when it came in one.
func unchangedSince(f *os.File, spec importSpec, before stamp) error {
	after, err := changeStamp(f)
	if err != nil {
		return err
	}
	if after == before {
		return nil
	}
	err = fmt.Errorf("%w: %s changed while it was copied (something still writes it); import it once nothing does",
		repository.ErrInvalidRequest, spec.src)
	if spec.field != "" {
		return &repository.FieldError{Field: spec.field, Err: err}
	}
	return err
}

// hashFile reads path to the end and returns its size and SHA-256, and with
// digests its digest table; with sync it also fsyncs the file.
func hashFile(ctx context.Context, path string, sync, digests bool, progress func(int64)) (storedArtifact, error) {
	f, err := os.Open(path)
	if err != nil {
		return storedArtifact{}, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	var h hash.Hash = sha256.New()
	var sink io.Writer = h
	var tables *integrity.Tables
	if digests {
		t := integrity.NewTables(0)
		tables, sink = &t, io.MultiWriter(h, t)
	}
	n, err := copyContext(ctx, sink, f, progress)
	if err != nil {
		return storedArtifact{}, fmt.Errorf("hash %s: %w", path, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			return storedArtifact{}, fmt.Errorf("fsync %s: %w", path, err)
		}
	}
	got := storedArtifact{size: n, sha256: hex.EncodeToString(h.Sum(nil))}
	if tables != nil {
		got.tables = repository.EncodeTables(*tables)
	}
	return got, nil
}

// copyContext copies src to dst in CopyBufferBytes units, stopping when ctx
// ends, and reports the running total after each unit.
func copyContext(ctx context.Context, dst io.Writer, src io.Reader, progress func(int64)) (int64, error) {
	buf := make([]byte, CopyBufferBytes)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, rerr := src.Read(buf)
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return total, err
			}
			total += int64(n)
			if progress != nil {
				progress(total)
			}
		}
		if errors.Is(rerr, io.EOF) {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// removeSnapshotDir removes the artifacts of id and makes the removal
// durable.
func (r *Repo) removeSnapshotDir(id string) error {
	dir := r.paths.snapshotDir(id)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove artifacts of %s: %w", id, err)
	}
	return durable.Sync(r.paths.snapshotsDir())
}

// checkArtifact confirms that an artifact exists, is a regular file and has
// the size the record gives.
func checkArtifact(path, name string, size int64) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return &repository.IntegrityError{Artifact: name, Want: strconv.FormatInt(size, 10) + " bytes", Got: "no file"}
	}
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	want := strconv.FormatInt(size, 10) + " bytes"
	if !fi.Mode().IsRegular() {
		// Its size is the entry's own (a symlink's target path, a
		// directory's blocks), nothing to compare.
		return &repository.IntegrityError{Artifact: name, Want: "a regular file of " + want, Got: "a " + untrusted.KindOf(fi.Mode())}
	}
	if fi.Size() != size {
		return &repository.IntegrityError{Artifact: name, Want: want, Got: strconv.FormatInt(fi.Size(), 10) + " bytes"}
	}
	return nil
}
