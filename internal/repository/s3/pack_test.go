package s3

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"testing"
	"time"

	"warmstart/internal/chunkcache"
)

// packTestBlock is the chunk cache block of these tests.
const packTestBlock = 64 << 10

// gatedOrigin serves bytes to a chunk cache object; started receives the
// offset of every fetch as it begins, and a fetch waits for gate when set.
type gatedOrigin struct {
	data    []byte
	gate    chan struct{}
	started chan int64
}

func (o *gatedOrigin) object(id string) chunkcache.Object {
	return chunkcache.Object{ID: id, Size: int64(len(o.data)), Fetch: func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
		o.started <- off
		if o.gate != nil {
			select {
			case <-o.gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return io.NopCloser(bytes.NewReader(o.data[off : off+length])), nil
	}}
}

// TestDemandJumpsTheStream: a read whose window covers a startup page
// still streaming in the pack and a page outside the startup set starts
// fetching that page's chunk at once, not after the pack's block arrived,
// and returns the memory's bytes.
func TestDemandJumpsTheStream(t *testing.T) {
	mem := make([]byte, 4*packTestBlock)
	if _, err := rand.Read(mem); err != nil {
		t.Fatal(err)
	}
	// The startup set: the first page of blocks 0 and 1.
	spans := []packSpan{{memOff: 0, length: 4096, packOff: 0}, {memOff: packTestBlock, length: 4096, packOff: 4096}}
	packData := append(append([]byte(nil), mem[:4096]...), mem[packTestBlock:packTestBlock+4096]...)
	memOrigin := &gatedOrigin{data: mem, started: make(chan int64, 16)}
	packOrigin := &gatedOrigin{data: packData, gate: make(chan struct{}), started: make(chan int64, 16)}

	c, err := chunkcache.Open(chunkcache.Options{Dir: t.TempDir(), MaxBytes: 64 << 20, BlockBytes: packTestBlock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	memRd, err := c.Open(memOrigin.object("mem"))
	if err != nil {
		t.Fatal(err)
	}
	packRd, err := c.Open(packOrigin.object("pack"))
	if err != nil {
		t.Fatal(err)
	}
	rd := &packedReader{cache: c, mem: memRd, pack: packRd, spans: spans}
	t.Cleanup(func() { rd.Close() })

	// The stream is on its way: the pack's block is being fetched.
	w, err := c.Warm(packOrigin.object("pack"), []chunkcache.Range{{Offset: 0, Length: int64(len(packData))}}, chunkcache.WarmOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	<-packOrigin.started

	// A fault's window: the startup page at 0 and the page after it.
	got := make([]byte, 8192)
	done := make(chan error, 1)
	go func() {
		_, err := rd.ReadAt(got, 0)
		done <- err
	}()
	select {
	case off := <-memOrigin.started:
		if off != 0 {
			t.Fatalf("chunk fetch at %d, want block 0", off)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the gap's chunk was not fetched while the pack's block was still streaming")
	}
	close(packOrigin.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, mem[:8192]) {
		t.Fatal("the read returned other bytes than the memory's")
	}
}
