package s3

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"warmstart/internal/chunkmap"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestStoreReaderFetchesEachChunkOnce: verify reads memory past the node
// cache in pieces smaller than a chunk; a chunk object is compressed
// whole, so each piece used to fetch and decode its whole chunk again (a
// 64 MiB chunk read in 1 MiB pieces was downloaded 64 times). Read in
// order, every stored chunk is fetched once, and the bytes are the
// published ones.
func TestStoreReaderFetchesEachChunkOnce(t *testing.T) {
	pub := chunkyRepo(t, "")
	in := chunkyInputs(t, 31)
	rec, _ := repotest.PublishInputs(t, pub, in, "")
	res, err := pub.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	rd := res.Memory.(*memorySource).OpenStoreMemory(bg())
	defer rd.Close()
	want, err := os.ReadFile(in.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	before := pub.RequestStats()
	got := make([]byte, 0, len(want))
	piece := make([]byte, 4096) // a quarter of a chunk
	for off := int64(0); off < rd.Size(); off += int64(len(piece)) {
		n, err := rd.ReadAt(piece, off)
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		got = append(got, piece[:n]...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the store reader read other bytes than the published memory")
	}
	// 8 chunks: one all zero (no object), the others fetched once each.
	if gets := pub.RequestStats().Sub(before).Gets; gets != 7 {
		t.Fatalf("read the memory in quarter-chunk pieces with %d GETs, want 7 (one per stored chunk)", gets)
	}
	if n, err := rd.ReadAt(nil, 100); n != 0 || err != nil {
		t.Fatalf("an empty read inside the memory returned %d, %v; want 0, nil", n, err)
	}
}

// TestStoreReaderFetchesADamagedChunkOnce: verify reads past a damaged
// part piece by piece; the pieces of a chunk found damaged fail at once,
// with its error, instead of each fetching the whole chunk again.
func TestStoreReaderFetchesADamagedChunkOnce(t *testing.T) {
	pub := chunkyRepo(t, "")
	in := chunkyInputs(t, 32)
	rec, _ := repotest.PublishInputs(t, pub, in, "")
	mem, err := os.ReadFile(in.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	const damaged = 1
	rewriteObject(t, pub, pub.keys.chunk(chunkmap.Sum(mem[damaged*testChunkBytes:(damaged+1)*testChunkBytes])),
		func(b []byte) []byte { b[len(b)/2] ^= 0x10; return b })
	res, err := pub.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	rd := res.Memory.(*memorySource).OpenStoreMemory(bg())
	defer rd.Close()
	before := pub.RequestStats()
	piece := make([]byte, 4096)
	for off := int64(damaged * testChunkBytes); off < (damaged+1)*testChunkBytes; off += int64(len(piece)) {
		if _, err := rd.ReadAt(piece, off); !errors.Is(err, repository.ErrIntegrity) {
			t.Fatalf("a piece of the damaged chunk at %d: %v, want ErrIntegrity", off, err)
		}
	}
	if gets := pub.RequestStats().Sub(before).Gets; gets != 1 {
		t.Fatalf("the damaged chunk's 4 pieces took %d GETs, want 1", gets)
	}
	if _, err := rd.ReadAt(piece, 0); err != nil {
		t.Fatalf("a good chunk after the damaged one: %v", err)
	}
}
