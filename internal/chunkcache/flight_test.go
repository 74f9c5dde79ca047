package chunkcache

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"testing"
	"time"
)

// gatedReader yields nothing until gate is closed, then r.
type gatedReader struct {
	gate chan struct{}
	r    io.Reader
}

func (g gatedReader) Read(p []byte) (int, error) {
	<-g.gate
	return g.r.Read(p)
}

// TestWaiterTakesArrivedPrefix: a read waiting on a block's fetch gets its
// bytes as soon as they have arrived, while the rest of the block is still
// on its way; the block is cached only once it is complete, and a read
// beyond what arrived waits for it.
func TestWaiterTakesArrivedPrefix(t *testing.T) {
	const block = 4 * progressBytes
	data := make([]byte, block)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	gate, started := make(chan struct{}), make(chan struct{}, 1)
	obj := Object{ID: "obj", Size: block, Fetch: func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
		started <- struct{}{}
		first := bytes.NewReader(data[:progressBytes])
		rest := gatedReader{gate, bytes.NewReader(data[progressBytes:])}
		return io.NopCloser(io.MultiReader(first, rest)), nil
	}}
	c, err := Open(Options{Dir: t.TempDir(), MaxBytes: 64 << 20, BlockBytes: block})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	w, err := c.Warm(obj, []Range{{0, block}}, WarmOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // unblock the fetch if the test fails early
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	r := openReader(t, c, obj)
	<-started // the warming's flight is registered: the read joins it

	got := make([]byte, 4096)
	prefix := make(chan error, 1)
	go func() {
		_, err := r.ReadAt(got, 100)
		prefix <- err
	}()
	select {
	case err := <-prefix:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read of the arrived prefix waited for the whole block")
	}
	if !bytes.Equal(got, data[100:4196]) {
		t.Fatal("the arrived prefix read back other bytes")
	}
	if c.Cached("obj", 0) {
		t.Fatal("a block was cached before it was complete")
	}

	beyond := make(chan error, 1)
	tail := make([]byte, 4096)
	go func() {
		_, err := r.ReadAt(tail, block-4096)
		beyond <- err
	}()
	close(gate)
	if err := <-beyond; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tail, data[block-4096:]) {
		t.Fatal("the block's end read back other bytes")
	}
	<-w.Done()
	if err := w.Err(); err != nil || !c.Cached("obj", 0) {
		t.Fatalf("after the fetch: err %v, cached %v", err, c.Cached("obj", 0))
	}
}
