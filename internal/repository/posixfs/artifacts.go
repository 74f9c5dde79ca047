package posixfs

import (
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

	"warmstart/internal/repository"
)

// Importing artifacts: a hard link where the source is on the store's file
// system (no bytes move; the link and the source are one inode), else a copy
// whose SHA-256 is computed while copying and again from the stored file
// after fsync, with the copy's pages dropped from the page cache first so
// the second pass reads what the disk holds rather than what was written.

// CopyBufferBytes is the read and write unit of copies and hashing.
const CopyBufferBytes = 1 << 20

// artifactFileMode is read-only: nothing rewrites an artifact in place.
const artifactFileMode = 0o444

// storedArtifact is what the record says about one imported artifact.
type storedArtifact struct {
	size   int64
	sha256 string
}

// importArtifact stores src as name in the snapshot directory dir. size is
// the source's size when Publish checked it; the stored file must have it.
func (r *Repo) importArtifact(ctx context.Context, src, dir, name string, size int64, tempFault string, progress func(repository.ImportProgress)) (storedArtifact, error) {
	tmp := filepath.Join(dir, tempName(name))
	committed := false
	defer func() {
		if !committed {
			os.Remove(tmp)
		}
	}()
	report := func(step string, done int64) {
		if progress != nil {
			progress(repository.ImportProgress{Artifact: name, Step: step, DoneBytes: done, TotalBytes: size})
		}
	}

	var got storedArtifact
	var err error
	if r.linkAllowed() && linkFollow(src, tmp) == nil {
		// The source may not have been synced by the VMM that wrote it.
		got, err = hashFile(ctx, tmp, true, func(n int64) { report(repository.StepHash, n) })
	} else {
		got, err = r.copyVerified(ctx, src, tmp, name, func(step string, n int64) { report(step, n) })
	}
	if err != nil {
		return storedArtifact{}, err
	}
	if got.size != size {
		return storedArtifact{}, &repository.IntegrityError{Artifact: name, Want: strconv.FormatInt(size, 10) + " bytes", Got: strconv.FormatInt(got.size, 10) + " bytes"}
	}
	r.fault(tempFault)
	final := filepath.Join(dir, name)
	if err := os.Rename(tmp, final); err != nil {
		return storedArtifact{}, fmt.Errorf("rename %s to %s: %w", tmp, final, err)
	}
	committed = true
	return got, nil
}

func (r *Repo) linkAllowed() bool { return !r.opts.ForceCopy }

// linkFollow hard-links the file src names, following a symlink: link(2)
// itself would link the symlink, leaving the store pointing outside itself.
func linkFollow(src, dst string) error {
	return unix.Linkat(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.AT_SYMLINK_FOLLOW)
}

// copyVerified copies src to the new file dst and checks that dst reads back,
// after fsync, as the bytes read from src.
func (r *Repo) copyVerified(ctx context.Context, src, dst, name string, progress func(step string, done int64)) (storedArtifact, error) {
	in, err := os.Open(src)
	if err != nil {
		return storedArtifact{}, fmt.Errorf("open %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, artifactFileMode)
	if err != nil {
		return storedArtifact{}, fmt.Errorf("create %s: %w", dst, err)
	}
	h := sha256.New()
	n, err := copyContext(ctx, io.MultiWriter(out, h), in, func(n int64) { progress(repository.StepCopy, n) })
	if err != nil {
		out.Close()
		return storedArtifact{}, fmt.Errorf("copy %s to %s: %w", src, dst, err)
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
	want := storedArtifact{size: n, sha256: hex.EncodeToString(h.Sum(nil))}
	got, err := hashFile(ctx, dst, false, func(n int64) { progress(repository.StepVerify, n) })
	if err != nil {
		return storedArtifact{}, err
	}
	if got != want {
		return storedArtifact{}, &repository.IntegrityError{Artifact: name, Want: want.sha256, Got: got.sha256}
	}
	return got, nil
}

// hashFile reads path to the end and returns its size and SHA-256; with
// sync it also fsyncs the file.
func hashFile(ctx context.Context, path string, sync bool, progress func(int64)) (storedArtifact, error) {
	f, err := os.Open(path)
	if err != nil {
		return storedArtifact{}, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	var h hash.Hash = sha256.New()
	n, err := copyContext(ctx, h, f, progress)
	if err != nil {
		return storedArtifact{}, fmt.Errorf("hash %s: %w", path, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			return storedArtifact{}, fmt.Errorf("fsync %s: %w", path, err)
		}
	}
	return storedArtifact{size: n, sha256: hex.EncodeToString(h.Sum(nil))}, nil
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
	return syncDir(r.paths.snapshotsDir())
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
	if !fi.Mode().IsRegular() || fi.Size() != size {
		return &repository.IntegrityError{Artifact: name, Want: strconv.FormatInt(size, 10) + " bytes", Got: strconv.FormatInt(fi.Size(), 10) + " bytes"}
	}
	return nil
}
