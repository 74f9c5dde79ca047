package chunkcache

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"
	"time"
)

// simStore serves an origin's bytes as an object store over a shaped
// link does: every GET waits wait before its first byte, and then its
// body comes at perGet bytes a second at most, all bodies together at
// link bytes a second at most. The delays are the simulated network the
// warming measures, not a wait for another goroutine.
type simStore struct {
	o            *origin
	wait         time.Duration
	perGet, link float64

	mu       sync.Mutex
	linkFree time.Time // when the link has sent what it was given
}

func (s *simStore) object(id string) Object {
	return Object{ID: id, Size: int64(len(s.o.data)), Fetch: s.fetch}
}

func (s *simStore) fetch(ctx context.Context, off, length int64) (io.ReadCloser, error) {
	s.o.fetches.Add(1)
	select {
	case <-time.After(s.wait):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	body := bytes.NewReader(s.o.data[off : off+length])
	return &simBody{s: s, r: body, ctx: ctx, free: time.Now()}, nil
}

// simBody paces one GET's body: a piece is in once both its connection
// and the shared link have had the time to send it.
type simBody struct {
	s    *simStore
	r    *bytes.Reader
	ctx  context.Context
	free time.Time // when this connection has sent what it was given
}

const simPiece = 16 << 10

func (b *simBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p[:min(len(p), simPiece)])
	if n == 0 {
		return n, err
	}
	now := time.Now()
	b.free = later(b.free, now).Add(seconds(float64(n) / b.s.perGet))
	b.s.mu.Lock()
	b.s.linkFree = later(b.s.linkFree, now).Add(seconds(float64(n) / b.s.link))
	at := later(b.free, b.s.linkFree)
	b.s.mu.Unlock()
	select {
	case <-time.After(time.Until(at)):
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	}
	return n, err
}

func (b *simBody) Close() error { return nil }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// warmOver warms a 48-block object through s, one block a run, base
// workers at first, and returns the depth it reached.
func warmOver(t *testing.T, s *simStore, base int) int {
	t.Helper()
	c := openCache(t, t.TempDir(), 64<<20)
	obj := s.object("obj")
	w, err := c.Warm(obj, []Range{{0, obj.Size}}, WarmOptions{Concurrency: base, RunCapBytes: testBlock, Deepen: true})
	if err != nil {
		t.Fatal(err)
	}
	<-w.Done()
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	if s := w.Stats(); s.FetchedBlocks != 48 || s.Gets != 48 {
		t.Fatalf("warm stats %+v, want all 48 blocks in 48 GETs", s)
	}
	r := openReader(t, c, obj)
	readCheck(t, r, s.o, 0, obj.Size)
	if got := s.o.fetches.Load(); got != 48 {
		t.Fatalf("%d GETs, want 48 (every block cached by the warming)", got)
	}
	return w.Depth()
}

// TestWarmDeepensWhenTheWaitDominates: a GET of a block takes 8 ms to
// transfer and waits 60 ms for its first byte, and the link carries 4
// GETs transferring at once, so 2 workers leave it idle most of the time:
// the warming adds workers, up to its cap of 4x the base.
func TestWarmDeepensWhenTheWaitDominates(t *testing.T) {
	rate := float64(testBlock) / 0.008
	s := &simStore{o: newOrigin(t, 48*testBlock), wait: 60 * time.Millisecond, perGet: rate, link: 4 * rate}
	if got := warmOver(t, s, 2); got <= 2 || got > 8 {
		t.Fatalf("depth %d, want above the base 2 and at most 8", got)
	}
}

// TestWarmKeepsItsDepthWhenTheLinkIsFull: the first byte comes after
// 1 ms, and two GETs transferring fill the link: 4 workers keep it full,
// and the warming adds none.
func TestWarmKeepsItsDepthWhenTheLinkIsFull(t *testing.T) {
	rate := float64(testBlock) / 0.008
	s := &simStore{o: newOrigin(t, 48*testBlock), wait: time.Millisecond, perGet: rate, link: 2 * rate}
	if got := warmOver(t, s, 4); got != 4 {
		t.Fatalf("depth %d, want the base 4", got)
	}
}
