package chunkcache

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// heldFetch is a FetchFunc whose bodies send nothing until release is
// closed, as a store that stalls does, and end with the fetch context's
// cause when it ends first. It counts its calls and hands each call's
// context to fetched.
type heldFetch struct {
	data    []byte
	release chan struct{}
	calls   atomic.Int64
	fetched chan context.Context
}

func newHeldFetch(t *testing.T, size int) *heldFetch {
	h := &heldFetch{data: make([]byte, size), release: make(chan struct{}), fetched: make(chan context.Context, 8)}
	if _, err := rand.Read(h.data); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
	})
	return h
}

// cacheWithHeldFetch opens a cache of block-sized blocks and an object
// of one block whose fetches hold (newHeldFetch). The fetch is released
// before the cache closes: cleanups run last-registered first.
func cacheWithHeldFetch(t *testing.T, id string, block int) (*Cache, *heldFetch, Object) {
	t.Helper()
	c, err := Open(Options{Dir: t.TempDir(), MaxBytes: 64 << 20, BlockBytes: int64(block)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := newHeldFetch(t, block)
	return c, h, Object{ID: id, Size: int64(block), Fetch: h.fetch}
}

func (h *heldFetch) fetch(ctx context.Context, off, length int64) (io.ReadCloser, error) {
	h.calls.Add(1)
	h.fetched <- ctx
	return io.NopCloser(heldBody{ctx: ctx, release: h.release, r: bytes.NewReader(h.data[off : off+length])}), nil
}

type heldBody struct {
	ctx     context.Context
	release chan struct{}
	r       io.Reader
}

func (b heldBody) Read(p []byte) (int, error) {
	select {
	case <-b.release:
		return b.r.Read(p)
	case <-b.ctx.Done():
		return 0, context.Cause(b.ctx)
	}
}

// TestGivenUpReadLeavesSharedFetchToOthers: a read that gives up (its
// restore is over) while its block's fetch waits on a stalled store
// returns at once with its context's cause, and the fetch goes on for a
// read that joined it, which gets the block without a second GET; a
// fetch nobody waits on any more is cancelled with the cause of the last
// read to give up.
func TestGivenUpReadLeavesSharedFetchToOthers(t *testing.T) {
	const block = 64 << 10
	c, h, obj := cacheWithHeldFetch(t, "shared", block)
	r := openReader(t, c, obj)

	over := errors.New("restore A is over")
	actx, stopA := context.WithCancelCause(context.Background())
	aDone := make(chan error, 1)
	go func() {
		_, err := r.ReadAtContext(actx, make([]byte, 4096), 0)
		aDone <- err
	}()
	fctx := <-h.fetched // A's GET is out, held by the store
	bDone := make(chan error, 1)
	got := make([]byte, 4096)
	go func() {
		_, err := r.ReadAtContext(context.Background(), got, 8192)
		bDone <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); c.Stats().Joins == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the second read never joined the fetch in flight")
		}
		time.Sleep(time.Millisecond)
	}

	stopA(over)
	select {
	case err := <-aDone:
		if !errors.Is(err, over) {
			t.Fatalf("the read given up returned %v, want its cause %v", err, over)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the read given up did not return")
	}
	if fctx.Err() != nil {
		t.Fatalf("the fetch another read waits on was cancelled: %v", context.Cause(fctx))
	}
	close(h.release) // the store answers
	if err := <-bDone; err != nil {
		t.Fatalf("the read that joined the fetch failed: %v", err)
	}
	if !bytes.Equal(got, h.data[8192:8192+4096]) {
		t.Fatal("the read that joined the fetch got other bytes")
	}
	if n := h.calls.Load(); n != 1 {
		t.Fatalf("the block was fetched %d times, want once", n)
	}

	// Alone on a block, the read that gives up takes the fetch with it.
	h2 := newHeldFetch(t, block)
	alone := openReader(t, c, Object{ID: "alone", Size: block, Fetch: h2.fetch})
	cctx, stopC := context.WithCancelCause(context.Background())
	cDone := make(chan error, 1)
	go func() {
		_, err := alone.ReadAtContext(cctx, make([]byte, 4096), 0)
		cDone <- err
	}()
	fctx = <-h2.fetched
	stopC(over)
	if err := <-cDone; !errors.Is(err, over) {
		t.Fatalf("the read given up returned %v, want %v", err, over)
	}
	if cause := context.Cause(fctx); !errors.Is(cause, over) {
		t.Fatalf("the fetch nobody waits on ended with %v, want cancelled with %v", cause, over)
	}
	if s := c.Stats(); s.FailedBlocks != 0 {
		t.Fatalf("a fetch given up put %d blocks in the failure holdoff", s.FailedBlocks)
	}
}

// TestStoppedWarmingLeavesSharedFetchToReaders: a warming stopped (its
// restore is over) while a demand read waits on one of its fetches ends
// at once, and the fetch goes on for the read, which gets the block
// without a second GET.
func TestStoppedWarmingLeavesSharedFetchToReaders(t *testing.T) {
	const block = 64 << 10
	c, h, obj := cacheWithHeldFetch(t, "warmed", block)
	w, err := c.Warm(obj, []Range{{0, block}}, WarmOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fctx := <-h.fetched // the warming's GET is out, held by the store
	r := openReader(t, c, obj)
	got := make([]byte, 4096)
	readDone := make(chan error, 1)
	go func() {
		_, err := r.ReadAtContext(context.Background(), got, 0)
		readDone <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); c.Stats().Joins == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the read never joined the warming's fetch")
		}
		time.Sleep(time.Millisecond)
	}
	stopped := make(chan struct{})
	go func() {
		w.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the warming did not stop while a read waited on its fetch")
	}
	if fctx.Err() != nil {
		t.Fatalf("the fetch a read waits on was cancelled with the warming: %v", context.Cause(fctx))
	}
	close(h.release)
	if err := <-readDone; err != nil {
		t.Fatalf("the read failed: %v", err)
	}
	if !bytes.Equal(got, h.data[:4096]) {
		t.Fatal("the read got other bytes")
	}
	if n := h.calls.Load(); n != 1 {
		t.Fatalf("the block was fetched %d times, want once", n)
	}
}
