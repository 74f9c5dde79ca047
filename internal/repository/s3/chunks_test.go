package s3

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/chunkmap"
	"warmstart/internal/layout"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

const testChunkBytes = 16 << 10

// chunkyInputs writes a memory file of 8 chunks of testChunkBytes: chunk 2
// all zeros, chunk 3 a copy of chunk 0, the others random.
func chunkyInputs(t *testing.T, seed uint64) repotest.Inputs {
	t.Helper()
	in := repotest.NewInputs(t, 8*testChunkBytes)
	mem := make([]byte, 8*testChunkBytes)
	rng := rand.New(rand.NewPCG(seed, 9))
	for i := range mem {
		mem[i] = byte(rng.Uint32())
	}
	clear(mem[2*testChunkBytes : 3*testChunkBytes])
	copy(mem[3*testChunkBytes:4*testChunkBytes], mem[:testChunkBytes])
	if err := os.WriteFile(in.MemoryPath, mem, 0o644); err != nil {
		t.Fatal(err)
	}
	in.MemorySHA256 = repotest.SHA256Hex(mem)
	in.Layout = layout.Layout{FileSize: int64(len(mem)), Regions: in.Layout.Regions}
	return in
}

func chunkyRepo(t *testing.T, prefix string) *Repo {
	t.Helper()
	needServer(t)
	return openWith(t, chunkyOptions(t, server.Endpoint, prefix))
}

// snapshotKeys are the keys under r's prefix that belong to snapshots:
// all but the shared chunks (garbage collection removes them, not delete
// or a failed publish), deletion tombstones (which keep chunks for
// restores in progress) and the lists of chunks publishes that never
// finished left (which the next collection reads).
func snapshotKeys(t *testing.T, r *Repo) []string {
	t.Helper()
	var out []string
	for _, k := range keysUnder(t, r) {
		if !strings.HasPrefix(k, chunksDir) && !strings.HasPrefix(k, tombstonesDir) && !strings.HasPrefix(k, abandonedDir) {
			out = append(out, k)
		}
	}
	return out
}

func chunkKeys(t *testing.T, r *Repo) []string {
	t.Helper()
	var out []string
	for _, k := range keysUnder(t, r) {
		if strings.HasPrefix(k, chunksDir) {
			out = append(out, k)
		}
	}
	return out
}

// TestChunkedPublishStoresEachChunkOnce: zero chunks are not stored, equal
// chunks once, and a second publish of the same memory uploads no chunk.
func TestChunkedPublishStoresEachChunkOnce(t *testing.T) {
	r := chunkyRepo(t, "")
	in := chunkyInputs(t, 1)
	rec, _ := repotest.PublishInputs(t, r, in, "")
	if rec.MemoryFormat != repository.MemoryFormatChunks || rec.MemoryChunks == nil || rec.MemoryChunks.ChunkBytes != testChunkBytes {
		t.Fatalf("record memory format %q, chunks %+v", rec.MemoryFormat, rec.MemoryChunks)
	}
	if got := chunkKeys(t, r); len(got) != 6 {
		t.Fatalf("%d chunk objects, want 6 (8 chunks, one zero, one repeated): %v", len(got), got)
	}
	if rec.MemoryChunks.StoredBytes <= 0 || rec.MemoryChunks.StoredBytes > 6*testChunkBytes+6*64 {
		t.Fatalf("stored bytes %d", rec.MemoryChunks.StoredBytes)
	}
	res, err := r.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := repotest.ResolvedMemorySHA256(t, res); got != in.MemorySHA256 {
		t.Fatalf("memory reads back as %s, published %s", got, in.MemorySHA256)
	}
	before := r.ChunksSkipped()
	keysBefore := strings.Join(chunkKeys(t, r), " ")
	again, _ := repotest.PublishInputs(t, r, in, "")
	if skipped := r.ChunksSkipped() - before; skipped != 7 {
		t.Fatalf("second publish skipped %d chunks, want all 7 non-zero ones", skipped)
	}
	if got := strings.Join(chunkKeys(t, r), " "); got != keysBefore {
		t.Fatalf("second publish changed the chunks: %s", got)
	}
	if again.MemoryChunks.SHA256 != rec.MemoryChunks.SHA256 {
		t.Fatal("equal memory got another chunk map")
	}
}

// openMemory resolves snapshot id on node and opens its memory for
// reading; the reader is closed when the test ends.
func openMemory(t *testing.T, node *Repo, id string) memdev.Lower {
	t.Helper()
	_, rd := resolveMemory(t, node, id)
	t.Cleanup(func() { rd.Close() })
	return rd
}

// resolveMemory resolves snapshot id on node and opens its memory for
// reading; the caller closes the reader.
func resolveMemory(t testing.TB, node *Repo, id string) (repository.Resolved, memdev.Lower) {
	t.Helper()
	res, err := node.Resolve(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := res.Memory.Open()
	if err != nil {
		t.Fatal(err)
	}
	return res, rd
}

// TestZeroChunkNeedsNoRequest: a cold node reads a zero chunk without a GET.
func TestZeroChunkNeedsNoRequest(t *testing.T) {
	pub, rec := chunkyPublisher(t, 2)
	node := chunkyRepo(t, pub.keys.prefix)
	rd := openMemory(t, node, rec.ID)
	before := node.RequestStats()
	buf := make([]byte, testChunkBytes)
	if _, err := rd.ReadAt(buf, 2*testChunkBytes); err != nil {
		t.Fatal(err)
	}
	if !chunkmap.IsZero(buf) {
		t.Fatal("the zero chunk read back non-zero")
	}
	if gets := node.RequestStats().Sub(before).Gets; gets != 0 {
		t.Fatalf("reading a zero chunk sent %d GETs", gets)
	}
}

// TestCorruptChunkObjectIsNeverServed damages chunk objects in the bucket,
// one with a flipped byte, one truncated: a cold node's reads of them fail
// with ErrIntegrity, and the other chunks still read right.
func TestCorruptChunkObjectIsNeverServed(t *testing.T) {
	pub := chunkyRepo(t, "")
	in := chunkyInputs(t, 3)
	rec, _ := repotest.PublishInputs(t, pub, in, "")
	mem, err := os.ReadFile(in.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	damage := map[int]func([]byte) []byte{
		1: func(b []byte) []byte { b[len(b)/2] ^= 0x10; return b },
		4: func(b []byte) []byte { return b[:len(b)-7] },
	}
	for idx, f := range damage {
		key := pub.keys.chunk(chunkmap.Sum(mem[idx*testChunkBytes : (idx+1)*testChunkBytes]))
		rewriteObject(t, pub, key, f)
	}
	node := chunkyRepo(t, pub.keys.prefix)
	rd := openMemory(t, node, rec.ID)
	buf := make([]byte, testChunkBytes)
	for idx := range 8 {
		_, err := rd.ReadAt(buf, int64(idx*testChunkBytes))
		want := mem[idx*testChunkBytes : (idx+1)*testChunkBytes]
		switch _, bad := damage[idx]; {
		case bad && !errors.Is(err, repository.ErrIntegrity):
			t.Fatalf("chunk %d (damaged): read error %v, want ErrIntegrity", idx, err)
		case !bad && err != nil:
			t.Fatalf("chunk %d: %v", idx, err)
		case !bad && !bytes.Equal(buf, want):
			t.Fatalf("chunk %d read wrong bytes", idx)
		}
	}
}

// rewriteObject replaces key's bytes with f of them.
func rewriteObject(t *testing.T, r *Repo, key string, f func([]byte) []byte) {
	t.Helper()
	body, _, _, err := r.core.GetObject(bg(), r.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(body)
	body.Close()
	if err != nil {
		t.Fatal(err)
	}
	data = f(data)
	if _, err := r.core.PutObject(bg(), r.bucket, key, bytes.NewReader(data), int64(len(data)), "", "", minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestOldRawRecordsStillRead: a record of format 1 (memory as one object)
// restores as before.
func TestOldRawRecordsStillRead(t *testing.T) {
	r := chunkyRepo(t, "")
	in := chunkyInputs(t, 4)
	rec := publishRaw(t, r, in)
	node := chunkyRepo(t, r.keys.prefix)
	res, err := node.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := repotest.ResolvedMemorySHA256(t, res); got != in.MemorySHA256 {
		t.Fatalf("raw memory reads back as %s, want %s", got, in.MemorySHA256)
	}
}

// publishRaw publishes in and rewrites its record as one of format 1,
// with the memory as one object (memory.bin) and no chunk map.
func publishRaw(t *testing.T, r *Repo, in repotest.Inputs) repository.Record {
	t.Helper()
	rec, _ := repotest.PublishInputs(t, r, in, "")
	data, err := os.ReadFile(in.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.putSmall(bg(), r.keys.artifact(rec.ID, repository.MemoryFileName), data, putCondition{}); err != nil {
		t.Fatal(err)
	}
	raw := rec
	raw.Format, raw.MemoryFormat, raw.MemoryChunks = 1, "", nil
	if _, err := r.putRecord(bg(), raw, putCondition{}); err != nil {
		t.Fatal(err)
	}
	if err := r.remove(bg(), r.keys.artifact(rec.ID, chunkMapName)); err != nil {
		t.Fatal(err)
	}
	return raw
}

// A memory object replaced in the bucket under a published snapshot (same
// key and size, other bytes: its ETag no longer matches) is damage, not a
// deletion: the read fails with ErrIntegrity, never ErrNotFound (which
// would let a recording be discarded as if the snapshot had been deleted).
// Once the snapshot is deleted, a read finds it gone: ErrNotFound.
func TestReplacedRawMemoryObjectIsAnIntegrityFailure(t *testing.T) {
	r := chunkyRepo(t, "")
	rec := publishRaw(t, r, chunkyInputs(t, 5))
	key := r.keys.artifact(rec.ID, repository.MemoryFileName)
	buf := make([]byte, testChunkBytes)

	replaced := openMemory(t, chunkyRepo(t, r.keys.prefix), rec.ID)
	rewriteObject(t, r, key, func(b []byte) []byte { b[0] ^= 0x01; return b })
	_, err := replaced.ReadAt(buf, 0)
	if !errors.Is(err, repository.ErrIntegrity) || errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("read of a replaced memory object: %v; want ErrIntegrity, not ErrNotFound", err)
	}

	deleted := openMemory(t, chunkyRepo(t, r.keys.prefix), rec.ID)
	if err := r.Delete(bg(), rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := deleted.ReadAt(buf, 0); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("read of a deleted snapshot's memory: %v; want ErrNotFound", err)
	}
}
