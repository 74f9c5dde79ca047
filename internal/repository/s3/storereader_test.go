package s3

import (
	"bytes"
	"io"
	"os"
	"testing"

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
