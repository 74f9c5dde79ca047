package s3

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/durable"
	"warmstart/internal/repository"
)

// Uploading artifacts: each part is read into memory once, hashed, and
// sent with its SHA-256 as the signed payload hash, which the store checks
// before it accepts the part. So the object holds exactly the bytes that
// were hashed for the record, without reading the object back.

// PartBytes is the unit of uploads: a file of at most this size is one PUT,
// a larger one a multipart upload of parts this size (the store's part
// count limit of 10,000 then allows 320 GiB).
const PartBytes = 32 << 20

// storedArtifact is what the record says about one uploaded artifact.
type storedArtifact struct {
	size   int64
	sha256 string
}

func (a storedArtifact) stored() repository.StoredArtifact {
	return repository.StoredArtifact{Size: a.size, SHA256: a.sha256}
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// upload stores the file at path as artifact name of id. size is the
// file's size when Publish checked it; the upload must find exactly that.
// digests, when not nil, is fed every byte, so the per-block digest table
// is built in the pass that hashes the file.
func (r *Repo) upload(ctx context.Context, id, name, path string, size int64, digests io.Writer, progress func(repository.ImportProgress)) (storedArtifact, error) {
	f, err := os.Open(path)
	if err != nil {
		return storedArtifact{}, fmt.Errorf("%w: %s file: %w", repository.ErrInvalidRequest, name, err)
	}
	defer f.Close()
	key := r.keys.artifact(id, name)
	report := func(done int64) {
		if progress != nil {
			progress(repository.ImportProgress{Artifact: name, Step: repository.StepCopy, DoneBytes: done, TotalBytes: size})
		}
	}
	whole := sha256.New()
	buf := make([]byte, min(size, PartBytes))
	readPart := func() (int, error) {
		n, err := io.ReadFull(f, buf)
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			err = nil
		}
		whole.Write(buf[:n])
		if digests != nil {
			digests.Write(buf[:n])
		}
		return n, err
	}
	sizeChanged := func(got int64) error {
		return &repository.IntegrityError{Artifact: name,
			Want: strconv.FormatInt(size, 10) + " bytes", Got: strconv.FormatInt(got, 10) + " bytes (changed during publish)"}
	}

	if size <= PartBytes {
		n, err := readPart()
		if err != nil {
			return storedArtifact{}, fmt.Errorf("read %s: %w", path, err)
		}
		if int64(n) != size || !atEOF(f) {
			return storedArtifact{}, sizeChanged(int64(n))
		}
		if err := ctx.Err(); err != nil {
			return storedArtifact{}, err
		}
		_, err = r.core.PutObject(ctx, r.bucket, key, bytes.NewReader(buf[:n]), int64(n), "", sha256Hex(buf[:n]),
			minio.PutObjectOptions{ContentType: "application/octet-stream"})
		if err != nil {
			return storedArtifact{}, ctxErr(ctx, r.integrityOr(name, fmt.Errorf("upload %s: %w", key, err)))
		}
		report(size)
		return storedArtifact{size: size, sha256: hex.EncodeToString(whole.Sum(nil))}, nil
	}

	uploadID, err := r.core.NewMultipartUpload(ctx, r.bucket, key, minio.PutObjectOptions{ContentType: "application/octet-stream"})
	if err != nil {
		return storedArtifact{}, ctxErr(ctx, fmt.Errorf("start upload %s: %w", key, err))
	}
	completed := false
	defer func() {
		if !completed {
			_ = r.core.AbortMultipartUpload(context.WithoutCancel(ctx), r.bucket, key, uploadID)
		}
	}()
	var parts []minio.CompletePart
	var done int64
	for done < size {
		if err := ctx.Err(); err != nil {
			return storedArtifact{}, err
		}
		n, err := readPart()
		if err != nil {
			return storedArtifact{}, fmt.Errorf("read %s: %w", path, err)
		}
		if n == 0 {
			return storedArtifact{}, sizeChanged(done)
		}
		part, err := r.core.PutObjectPart(ctx, r.bucket, key, uploadID, len(parts)+1, bytes.NewReader(buf[:n]), int64(n),
			minio.PutObjectPartOptions{Sha256Hex: sha256Hex(buf[:n])})
		if err != nil {
			return storedArtifact{}, ctxErr(ctx, r.integrityOr(name, fmt.Errorf("upload %s part %d: %w", key, len(parts)+1, err)))
		}
		parts = append(parts, minio.CompletePart{PartNumber: part.PartNumber, ETag: part.ETag})
		done += int64(n)
		report(min(done, size))
	}
	if done != size || !atEOF(f) {
		return storedArtifact{}, sizeChanged(done)
	}
	if _, err := r.core.CompleteMultipartUpload(ctx, r.bucket, key, uploadID, parts, minio.PutObjectOptions{}); err != nil {
		return storedArtifact{}, ctxErr(ctx, fmt.Errorf("complete upload %s: %w", key, err))
	}
	completed = true
	return storedArtifact{size: size, sha256: hex.EncodeToString(whole.Sum(nil))}, nil
}

// integrityOr marks the store's refusal of a payload whose hash differs
// from the one sent (the bytes changed on the way) as ErrIntegrity.
func (r *Repo) integrityOr(name string, err error) error {
	switch minio.ToErrorResponse(err).Code {
	case "XAmzContentSHA256Mismatch", "BadDigest", "InvalidDigest":
		return fmt.Errorf("%w: %s: %w", repository.ErrIntegrity, name, err)
	}
	return err
}

func atEOF(f *os.File) bool {
	var b [1]byte
	n, _ := f.Read(b[:])
	return n == 0
}

// removeArtifacts deletes every object under id's artifacts prefix.
func (r *Repo) removeArtifacts(ctx context.Context, id string) error {
	objs, err := r.list(ctx, r.keys.artifactsPrefix(id))
	if err != nil {
		return fmt.Errorf("remove artifacts of %s: %w", id, err)
	}
	var errs []error
	for _, o := range objs {
		if err := r.remove(ctx, o.Key); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove artifacts of %s: %w", id, err)
	}
	return nil
}

// fetchLocal makes a local copy of a small artifact (VM state, manifest)
// in the node's file cache, named by the SHA-256 of its bytes, and returns
// its path. A copy already there is used after its hash is checked. When
// the object's bytes do not hash to want (a manifest replaced under a
// concurrent attach), the copy is still made, under its own hash, so that
// the consumer's check finds the mismatch; want == "" skips the lookup.
func (r *Repo) fetchLocal(ctx context.Context, key, want string, size int64) (string, error) {
	if want != "" {
		p := filepath.Join(r.filesDir, want)
		if data, err := os.ReadFile(p); err == nil && int64(len(data)) == size && sha256Hex(data) == want {
			return p, nil
		}
	}
	body, info, _, err := r.core.GetObject(ctx, r.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		if isNotFound(err) {
			return "", fmt.Errorf("%w: %s is missing", os.ErrNotExist, key)
		}
		return "", ctxErr(ctx, fmt.Errorf("get %s: %w", key, err))
	}
	defer body.Close()
	if info.Size != size {
		return "", &repository.IntegrityError{Artifact: filepath.Base(key),
			Want: strconv.FormatInt(size, 10) + " bytes", Got: strconv.FormatInt(info.Size, 10) + " bytes"}
	}
	data, err := io.ReadAll(io.LimitReader(body, size+1))
	if err != nil {
		return "", ctxErr(ctx, fmt.Errorf("get %s: %w", key, err))
	}
	if int64(len(data)) != size {
		return "", fmt.Errorf("get %s: %d of %d bytes: %w", key, len(data), size, io.ErrUnexpectedEOF)
	}
	got := sha256Hex(data)
	p := filepath.Join(r.filesDir, got)
	if err := durable.WriteBytes(p, 0o444, data); err != nil {
		return "", fmt.Errorf("cache %s locally: %w", key, err)
	}
	return p, nil
}

// fetchForCheck fetches an artifact whose consumer checks it against the
// record and says what is wrong (the manifest, the refinement, the digest
// table), and returns its local path as a POSIX store would: a missing
// object gives a path that does not exist and is named after the object
// (files/missing/memory.digests), and an object of another size is
// fetched as it is stored (at most size+1 bytes), so the consumer names
// the size it found rather than a cache file named by the expected digest.
func (r *Repo) fetchForCheck(ctx context.Context, key, want string, size int64) (string, error) {
	p, err := r.fetchLocal(ctx, key, want, size)
	switch {
	case err == nil:
		return p, nil
	case errors.Is(err, repository.ErrIntegrity):
		if p, err := r.fetchAsStored(ctx, key, size+1); err == nil {
			return p, nil
		}
		fallthrough
	case errors.Is(err, os.ErrNotExist):
		return filepath.Join(r.filesDir, "missing", filepath.Base(key)), nil
	}
	return "", err
}

// fetchAsStored caches the first limit bytes of the object at key under
// their own SHA-256, whatever the record says of them.
func (r *Repo) fetchAsStored(ctx context.Context, key string, limit int64) (string, error) {
	body, _, _, err := r.core.GetObject(ctx, r.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return "", ctxErr(ctx, fmt.Errorf("get %s: %w", key, err))
	}
	defer body.Close()
	data, err := io.ReadAll(io.LimitReader(body, limit))
	if err != nil {
		return "", ctxErr(ctx, fmt.Errorf("get %s: %w", key, err))
	}
	p := filepath.Join(r.filesDir, sha256Hex(data))
	if err := durable.WriteBytes(p, 0o444, data); err != nil {
		return "", fmt.Errorf("cache %s locally: %w", key, err)
	}
	return p, nil
}
