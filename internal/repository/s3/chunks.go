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
	"sync"
	"time"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/chunkmap"
	"warmstart/internal/repository"
)

// Chunked memory: publish cuts the memory file into chunks, stores each
// non-zero chunk the bucket lacks as chunks/<sha256>.zst, and writes the
// chunk map; readers fetch a chunk with one GET, decode it and check its
// SHA-256 before any byte of it reaches the chunk cache.

const (
	// publishWorkers bounds the chunks hashed at once, and those looked
	// for, compressed and uploaded at once (and so the memory a publish
	// holds: 2*workers+1 chunks).
	publishWorkers = 8
	// chunkFetchConcurrency bounds the chunk GETs one cache run issues.
	chunkFetchConcurrency = 4
	// ChunkGrace is how long after its last write garbage collection
	// keeps a chunk object that nothing names (no chunk map, journal or
	// young tombstone) and no list of a publish that never finished
	// names, and how long a deleted snapshot's tombstone keeps its chunks
	// (gc.go).
	ChunkGrace = 6 * time.Hour
)

// A publish that finds a chunk older than half the chunk grace uploads it
// again, which renews its modification time, so the chunk is younger than
// the grace for the rest of the publish: a collection that read the
// journals before this publish named the chunk keeps it all the same, and
// the publish's final check (confirmChunks) rarely has one to upload
// again. (A server-side copy onto itself would save the upload, but MinIO
// was seen to keep the old time.)

// chunkJob is one chunk read from the memory file, on its way to a hasher.
type chunkJob struct {
	index int
	data  []byte
}

// uploadChunked stores the memory file at path as chunks and returns it as
// stored (size and SHA-256 of the whole file) with its chunk map. digests
// is fed every byte in order, so the digest table is built in this pass.
//
// It runs as a pipeline: the feeder reads the file in order, hashing it
// whole and feeding digests; hashers name each chunk (its SHA-256, or
// zero); the journaler names them in the journal of publish id, in file
// order (journal.go); workers store the chunks a journal write named,
// reading again from the file those they upload.
func (r *Repo) uploadChunked(ctx context.Context, id, path string, size int64, digests io.Writer,
	progress func(repository.ImportProgress)) (storedArtifact, chunkmap.Map, error) {
	f, err := os.Open(path)
	if err != nil {
		return storedArtifact{}, chunkmap.Map{}, fmt.Errorf("%w: memory file: %w", repository.ErrInvalidRequest, err)
	}
	defer f.Close()
	m := chunkmap.Map{ChunkBytes: r.chunkBytes, Size: size}
	m.Chunks = make([]chunkmap.Chunk, (size+m.ChunkBytes-1)/m.ChunkBytes)
	stored := make([]int64, len(m.Chunks))
	// The first failure stops every stage; its error is the one reported,
	// not the cancellation it caused.
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	report := r.chunkProgress(size, progress)
	jobs, hashed, ready := make(chan chunkJob), make(chan int, publishWorkers), make(chan int, 2*journalMaxStep)
	var hashers, workers sync.WaitGroup
	for range publishWorkers {
		hashers.Go(func() { hashChunks(wctx, m, jobs, hashed) })
		workers.Go(func() {
			for i := range ready {
				n, err := r.storeChunk(wctx, f, m, i)
				if err != nil {
					cancel(err)
					continue
				}
				stored[i] = n
				report(m.Length(i))
			}
		})
	}
	journaled := make(chan struct{})
	go func() {
		defer close(journaled)
		defer close(ready)
		if err := r.newJournal(id).follow(wctx, m, hashed, ready); err != nil {
			cancel(err)
		}
	}()
	whole, readErr := feedChunks(wctx, f, m, digests, jobs)
	close(jobs)
	hashers.Wait()
	close(hashed)
	<-journaled
	workers.Wait()
	if cause := context.Cause(wctx); cause != nil && readErr == nil {
		readErr = ctxErr(ctx, cause)
	}
	if readErr != nil {
		return storedArtifact{}, chunkmap.Map{}, readErr
	}
	for i := range m.Chunks {
		m.Chunks[i].StoredBytes = stored[i]
	}
	return storedArtifact{size: size, sha256: whole}, m, nil
}

// feedChunks reads the memory file chunk by chunk, hashing it whole and
// feeding digests, and hands the chunks to the hashers. It returns the
// file's SHA-256; a file whose size changed since it was checked is a
// source changed under the publish (sourceChangedError).
func feedChunks(ctx context.Context, f *os.File, m chunkmap.Map, digests io.Writer, jobs chan<- chunkJob) (string, error) {
	whole := sha256.New()
	for i := range m.Chunks {
		buf := make([]byte, m.Length(i))
		n, err := io.ReadFull(f, buf)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("read %s: %w", f.Name(), err)
		}
		if n != len(buf) {
			return "", sizeChangedError(f.Name(), m.Size, int64(i)*m.ChunkBytes+int64(n))
		}
		whole.Write(buf)
		if digests != nil {
			digests.Write(buf)
		}
		select {
		case jobs <- chunkJob{index: i, data: buf}:
		case <-ctx.Done():
			return "", nil // the cause is the caller's to report
		}
	}
	if !atEOF(f) {
		return "", sourceChanged(f.Name(), fmt.Sprintf("more than the %d bytes first found", m.Size))
	}
	return hex.EncodeToString(whole.Sum(nil)), nil
}

// hashChunks describes in m each chunk it takes from jobs (its digest, or
// zero) and passes its index on to hashed. The chunk's bytes are dropped:
// a worker that uploads the chunk reads it again.
func hashChunks(ctx context.Context, m chunkmap.Map, jobs <-chan chunkJob, hashed chan<- int) {
	for j := range jobs {
		m.Chunks[j.index] = describeChunk(j.data)
		select {
		case hashed <- j.index:
		case <-ctx.Done():
		}
	}
}

// describeChunk is the map entry of a chunk's bytes, its stored size not
// known yet.
func describeChunk(data []byte) chunkmap.Chunk {
	if chunkmap.IsZero(data) {
		return chunkmap.Chunk{Zero: true}
	}
	return chunkmap.Chunk{Digest: chunkmap.Sum(data)}
}

// sizeChangedError is the error of a source file at path found to hold
// got bytes, not the want bytes the publish first found.
func sizeChangedError(path string, want, got int64) error {
	return sourceChanged(path, fmt.Sprintf("%d bytes, not the %d first found", got, want))
}

// chunkProgress returns a goroutine-safe reporter of bytes done.
func (r *Repo) chunkProgress(size int64, progress func(repository.ImportProgress)) func(int64) {
	var mu sync.Mutex
	var done int64
	return func(n int64) {
		mu.Lock()
		defer mu.Unlock()
		done += n
		if progress != nil {
			progress(repository.ImportProgress{Artifact: repository.MemoryFileName, Step: repository.StepCopy, DoneBytes: done, TotalBytes: size})
		}
	}
}

// storeChunk makes sure chunk i of m, read from the memory file f, is in
// the bucket: found there (uploaded by this or any snapshot), or uploaded
// now. It returns the size of its object; an all-zero chunk has none.
func (r *Repo) storeChunk(ctx context.Context, f *os.File, m chunkmap.Map, i int) (int64, error) {
	c := m.Chunks[i]
	if c.Zero {
		return 0, nil
	}
	key := r.keys.chunk(c.Digest)
	info, err := r.core.StatObject(ctx, r.bucket, key, minio.StatObjectOptions{})
	switch {
	case err == nil && time.Since(info.LastModified) < r.chunkGrace/2:
		r.chunksSkipped.Add(1)
		return info.Size, nil
	case err != nil && !isNotFound(err):
		return 0, ctxErr(ctx, fmt.Errorf("stat %s: %w", key, err))
	}
	return r.uploadChunk(ctx, f, m, i)
}

// uploadChunk reads chunk i of m from the memory file f and uploads it
// under its digest, returning the stored size. Bytes that no longer hash
// to the digest the feeder found mean the file changed under the publish.
func (r *Repo) uploadChunk(ctx context.Context, f *os.File, m chunkmap.Map, i int) (int64, error) {
	c := m.Chunks[i]
	data := make([]byte, m.Length(i))
	n, err := f.ReadAt(data, int64(i)*m.ChunkBytes)
	switch {
	case n < len(data) && errors.Is(err, io.EOF):
		return 0, sizeChangedError(f.Name(), m.Size, int64(i)*m.ChunkBytes+int64(n))
	case err != nil && n < len(data):
		return 0, fmt.Errorf("read %s: %w", f.Name(), err)
	case chunkmap.Sum(data) != c.Digest:
		return 0, sourceChanged(f.Name(), fmt.Sprintf("chunk %d no longer holds the bytes first read", i))
	}
	stored := chunkmap.Compress(data)
	key := r.keys.chunk(c.Digest)
	if _, err := r.core.PutObject(ctx, r.bucket, key, bytes.NewReader(stored), int64(len(stored)), "", sha256Hex(stored),
		minio.PutObjectOptions{ContentType: "application/zstd"}); err != nil {
		return 0, ctxErr(ctx, r.integrityOr(repository.MemoryFileName, fmt.Errorf("upload %s: %w", key, err)))
	}
	return int64(len(stored)), nil
}

// fetchChunk returns chunk c's length bytes: zeros without a request for a
// zero chunk, else its object decoded and checked against its digest. A
// missing object is ErrNotFound; a corrupt or truncated one ErrIntegrity.
func (r *Repo) fetchChunk(ctx context.Context, c chunkmap.Chunk, length int64) ([]byte, error) {
	if c.Zero {
		return make([]byte, length), nil
	}
	key := r.keys.chunk(c.Digest)
	body, _, _, err := r.core.GetObject(ctx, r.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		if isNotFound(err) {
			return nil, fmt.Errorf("chunk %s: %w: %w", key, repository.ErrNotFound, err)
		}
		return nil, ctxErr(ctx, fmt.Errorf("get %s: %w", key, err))
	}
	defer body.Close()
	stored, err := io.ReadAll(io.LimitReader(body, 2*chunkmap.MaxChunkBytes+1))
	if err != nil {
		return nil, ctxErr(ctx, fmt.Errorf("get %s: %w", key, err))
	}
	chunkDigestBytes.Add(length)
	data, err := chunkmap.Decompress(stored, int(length), c.Digest)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", repository.ErrIntegrity, key, err)
	}
	return data, nil
}

// chunkedFetch is the chunk cache's FetchFunc of chunked memory: bytes
// [off, off+length) assembled from the chunks they span, fetched up to
// chunkFetchConcurrency at once and streamed in order, so the cache
// resolves the first block of a run as soon as its chunk is in.
func (r *Repo) chunkedFetch(m chunkmap.Map) func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
	return func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
		if off < 0 || length <= 0 || off+length > m.Size {
			return nil, fmt.Errorf("fetch [%d, +%d) of chunked memory of %d bytes: out of range", off, length, m.Size)
		}
		pr, pw := io.Pipe()
		go r.streamChunks(ctx, m, off, length, pw)
		return pr, nil
	}
}

type chunkResult struct {
	data []byte
	err  error
}

func (r *Repo) streamChunks(ctx context.Context, m chunkmap.Map, off, length int64, pw *io.PipeWriter) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first, last := off/m.ChunkBytes, (off+length-1)/m.ChunkBytes
	results := make([]chan chunkResult, last-first+1)
	sem := make(chan struct{}, chunkFetchConcurrency)
	for i := range results {
		results[i] = make(chan chunkResult, 1)
		idx := int(first) + i
		go func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				results[i] <- chunkResult{err: ctx.Err()}
				return
			}
			defer func() { <-sem }()
			data, err := r.fetchChunk(ctx, m.Chunks[idx], m.Length(idx))
			results[i] <- chunkResult{data, err}
		}()
	}
	for i, ch := range results {
		res := <-ch
		if res.err != nil {
			pw.CloseWithError(res.err)
			return
		}
		start := (first + int64(i)) * m.ChunkBytes
		lo, hi := max(off, start)-start, min(off+length, start+int64(len(res.data)))-start
		if _, err := pw.Write(res.data[lo:hi]); err != nil {
			return // the reader went away; cancel stops the other GETs
		}
	}
	pw.Close()
}

// confirmChunks runs after the chunk map is stored (from then on every
// collection that lists maps keeps the chunks) and before the record: it
// checks that every chunk the map names is still in the bucket and
// uploads again, from the memory file, any that a collection racing this
// publish removed in the meantime.
func (r *Repo) confirmChunks(ctx context.Context, path string, m chunkmap.Map) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: memory file: %w", repository.ErrInvalidRequest, err)
	}
	defer f.Close()
	seen := map[chunkmap.Digest]bool{}
	for i, c := range m.Chunks {
		if c.Zero || seen[c.Digest] {
			continue
		}
		seen[c.Digest] = true
		key := r.keys.chunk(c.Digest)
		_, err := r.core.StatObject(ctx, r.bucket, key, minio.StatObjectOptions{})
		if err == nil {
			continue
		}
		if !isNotFound(err) {
			return ctxErr(ctx, fmt.Errorf("stat %s: %w", key, err))
		}
		if _, err := r.uploadChunk(ctx, f, m, i); err != nil {
			return err
		}
	}
	return nil
}
