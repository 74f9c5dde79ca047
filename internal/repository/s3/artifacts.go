package s3

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
	u := &artifactUpload{r: r, f: f, name: name, path: path, key: r.keys.artifact(id, name), size: size,
		whole: sha256.New(), digests: digests, progress: progress, buf: make([]byte, min(size, PartBytes))}
	if size <= PartBytes {
		err = u.putWhole(ctx)
	} else {
		err = u.putParts(ctx)
	}
	if err != nil {
		return storedArtifact{}, err
	}
	return storedArtifact{size: size, sha256: hex.EncodeToString(u.whole.Sum(nil))}, nil
}

// artifactUpload is one file on its way to the store, read once: every
// part read is hashed (and fed to digests) as it goes up.
type artifactUpload struct {
	r               *Repo
	f               *os.File
	name, path, key string
	size            int64
	whole           hash.Hash
	digests         io.Writer
	progress        func(repository.ImportProgress)
	buf             []byte
}

// readPart reads the next part into buf, up to its length, and hashes it.
func (u *artifactUpload) readPart() (int, error) {
	n, err := io.ReadFull(u.f, u.buf)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil
	}
	u.whole.Write(u.buf[:n])
	if u.digests != nil {
		u.digests.Write(u.buf[:n])
	}
	if err != nil {
		return n, fmt.Errorf("read %s: %w", u.path, err)
	}
	return n, nil
}

// sizeChanged is the error of a file found to hold got bytes, not the
// size Publish checked.
func (u *artifactUpload) sizeChanged(got int64) error {
	return sizeChangedError(u.path, u.size, got)
}

// sourceChangedError is a source file of a publish found to differ, in
// size or bytes, from what the publish first read of it: something still
// writes it. It is the request's to change (an invalid request), not a
// failure of stored data, which stays an integrity error.
type sourceChangedError struct {
	path, how string
}

func (e *sourceChangedError) Error() string {
	return fmt.Sprintf("%s: %s changed while it was uploaded (%s; something still writes it); import it once nothing does",
		repository.ErrInvalidRequest, e.path, e.how)
}

func (e *sourceChangedError) Unwrap() error { return repository.ErrInvalidRequest }

func sourceChanged(path, how string) error { return &sourceChangedError{path: path, how: how} }

// onField puts err, when it is a request's file found changed, on the
// request's field that named the file, as the POSIX store does.
func onField(field string, err error) error {
	var changed *sourceChangedError
	if fe := (*repository.FieldError)(nil); errors.As(err, &changed) && !errors.As(err, &fe) {
		return &repository.FieldError{Field: field, Err: err}
	}
	return err
}

func (u *artifactUpload) report(done int64) {
	if u.progress != nil {
		u.progress(repository.ImportProgress{Artifact: u.name, Step: repository.StepCopy, DoneBytes: done, TotalBytes: u.size})
	}
}

// putWhole stores a file of at most one part with one PUT.
func (u *artifactUpload) putWhole(ctx context.Context) error {
	n, err := u.readPart()
	if err != nil {
		return err
	}
	if int64(n) != u.size || !atEOF(u.f) {
		return u.sizeChanged(int64(n))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err = u.r.core.PutObject(ctx, u.r.bucket, u.key, bytes.NewReader(u.buf[:n]), int64(n), "", sha256Hex(u.buf[:n]),
		minio.PutObjectOptions{ContentType: "application/octet-stream"})
	if err != nil {
		return ctxErr(ctx, u.r.integrityOr(u.name, fmt.Errorf("upload %s: %w", u.key, err)))
	}
	u.report(u.size)
	return nil
}

// putParts stores a larger file as a multipart upload, aborted unless it
// completes.
func (u *artifactUpload) putParts(ctx context.Context) error {
	r := u.r
	uploadID, err := r.core.NewMultipartUpload(ctx, r.bucket, u.key, minio.PutObjectOptions{ContentType: "application/octet-stream"})
	if err != nil {
		return ctxErr(ctx, fmt.Errorf("start upload %s: %w", u.key, err))
	}
	parts, err := u.sendParts(ctx, uploadID)
	if err == nil {
		_, err = r.core.CompleteMultipartUpload(ctx, r.bucket, u.key, uploadID, parts, minio.PutObjectOptions{})
		if err == nil {
			return nil
		}
		err = ctxErr(ctx, fmt.Errorf("complete upload %s: %w", u.key, err))
	}
	_ = r.core.AbortMultipartUpload(context.WithoutCancel(ctx), r.bucket, u.key, uploadID)
	return err
}

// sendParts uploads the file part after part and checks that it ended
// where Publish found it ending.
func (u *artifactUpload) sendParts(ctx context.Context, uploadID string) ([]minio.CompletePart, error) {
	var parts []minio.CompletePart
	var done int64
	for done < u.size {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := u.readPart()
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, u.sizeChanged(done)
		}
		part, err := u.r.core.PutObjectPart(ctx, u.r.bucket, u.key, uploadID, len(parts)+1, bytes.NewReader(u.buf[:n]), int64(n),
			minio.PutObjectPartOptions{Sha256Hex: sha256Hex(u.buf[:n])})
		if err != nil {
			return nil, ctxErr(ctx, u.r.integrityOr(u.name, fmt.Errorf("upload %s part %d: %w", u.key, len(parts)+1, err)))
		}
		parts = append(parts, minio.CompletePart{PartNumber: part.PartNumber, ETag: part.ETag})
		done += int64(n)
		u.report(min(done, u.size))
	}
	if done != u.size || !atEOF(u.f) {
		return nil, u.sizeChanged(done)
	}
	return parts, nil
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
	return r.cacheFile(key, sha256Hex(data), data)
}

// fetchForCheck fetches an artifact whose consumer checks it against the
// record and says what is wrong (the manifest, the refinement, the digest
// table), and returns its local path as a POSIX store would: a missing
// object gives a path that does not exist and ends in the object's key
// (files/not-in-the-store/PREFIX/artifacts/ID/memory.digests), so the
// consumer's "no such file" names what the store lacks; an object of another size is
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
		// Cleaned as an absolute path first, so no ".." in the key leads
		// outside the cache.
		return filepath.Join(r.filesDir, "not-in-the-store", filepath.Clean("/"+key)), nil
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
	return r.cacheFile(key, sha256Hex(data), data)
}

// cacheFile writes the bytes of the object at key into the node's file
// cache under their SHA-256 sum. The directory is made again first when
// it was removed under the running repository (an operator clearing the
// cache): its "no such file" would otherwise read as the object missing
// from the store, and fail every resolve as damage until a restart.
func (r *Repo) cacheFile(key, sum string, data []byte) (string, error) {
	if err := os.MkdirAll(r.filesDir, 0o700); err != nil {
		return "", fmt.Errorf("cache %s locally: %w", key, err)
	}
	p := filepath.Join(r.filesDir, sum)
	if err := durable.WriteBytes(p, 0o444, data); err != nil {
		return "", fmt.Errorf("cache %s locally: %w", key, err)
	}
	return p, nil
}
