package chunkcache

import (
	"context"
	"crypto/rand"
	"io"
	"slices"
	"sync"
	"testing"
)

// TestRampedWarmingEndsItsFirstGetsOneAfterAnother streams a pack-like
// object front to back over a link its GETs share, each waiting out a round
// trip for its first byte: the first GETs, sent together, end one after
// the other (at least a block apart), the front first, so that they never
// all wait out the next round trip at the same moment.
func TestRampedWarmingEndsItsFirstGetsOneAfterAnother(t *testing.T) {
	const workers = 6
	l := newSharedLink(t, 36*testBlock, testBlock/4, 4*testBlock)
	c := openCache(t, t.TempDir(), 64<<20)
	obj := Object{ID: "pack", Size: int64(len(l.data)), Fetch: l.fetch}
	w, err := c.Warm(obj, []Range{{0, obj.Size}}, WarmOptions{Concurrency: workers, RunCapBytes: 2 * testBlock, Ramp: true})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first GETs to be sent", func() bool { return l.sent() == workers })
	l.start()
	<-w.Done()
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	first := l.firstRound(workers)
	for i := 1; i < len(first); i++ {
		gap := first[i].ended - first[i-1].ended
		if gap < testBlock {
			t.Errorf("GET [%d, +%d) ended %d bytes after GET [%d, +%d): the first GETs end together (want a block, %d, apart)",
				first[i].off, first[i].length, gap, first[i-1].off, first[i-1].length, testBlock)
		}
		if first[i].off < first[i-1].off {
			t.Errorf("GET at %d ended before GET at %d: the front does not come first", first[i-1].off, first[i].off)
		}
	}
	r := openReader(t, c, obj)
	buf := make([]byte, obj.Size)
	if _, err := r.ReadAt(buf, 0); err != nil || string(buf) != string(l.data) {
		t.Fatalf("the warmed object reads back wrong (err %v)", err)
	}
}

// sharedLink is a store whose GETs share one link, stepped in bytes rather
// than time: the link carries unit bytes to each GET in turn (an even
// share, as connections on one link get), and a GET receives only once the
// link has carried rtt bytes since it was sent (its wait for the first
// byte; an idle link lets that time pass). A GET's end is the bytes the
// link had carried when it ended, so the test sees what a timed store
// would, without depending on timing.
type sharedLink struct {
	data      []byte
	unit, rtt int64
	stop      chan struct{}
	go_       chan struct{}
	wake      chan struct{}

	mu      sync.Mutex
	carried int64
	gets    []*linkGet
}

// linkGet is one GET on a sharedLink.
type linkGet struct {
	ctx         context.Context
	off, length int64
	joinAt      int64         // the link's carried bytes when its first byte may go
	given       int64         // bytes the link has carried to it
	ended       int64         // carried when its last byte went, -1 before
	grants      chan []byte   // the link's units for it, closed after the last
	left        []byte        // a unit it has not read all of
	gone        chan struct{} // closed when the link stops serving it
}

func newSharedLink(t *testing.T, size int, unit, rtt int64) *sharedLink {
	t.Helper()
	l := &sharedLink{data: make([]byte, size), unit: unit, rtt: rtt,
		stop: make(chan struct{}), go_: make(chan struct{}), wake: make(chan struct{}, 1)}
	if _, err := rand.Read(l.data); err != nil {
		t.Fatal(err)
	}
	go l.serve()
	t.Cleanup(func() { close(l.stop) })
	return l
}

func (l *sharedLink) fetch(ctx context.Context, off, length int64) (io.ReadCloser, error) {
	l.mu.Lock()
	g := &linkGet{ctx: ctx, off: off, length: length, joinAt: l.carried + l.rtt, ended: -1,
		grants: make(chan []byte), gone: make(chan struct{})}
	l.gets = append(l.gets, g)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return g, nil
}

// sent is the number of GETs sent so far.
func (l *sharedLink) sent() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.gets)
}

// start lets the link carry bytes: the GETs sent before then start
// together.
func (l *sharedLink) start() { close(l.go_) }

// firstRound returns copies of the first n GETs sent, in the order they
// ended.
func (l *sharedLink) firstRound(n int) []linkGet {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []linkGet
	for _, g := range l.gets[:n] {
		out = append(out, linkGet{off: g.off, length: g.length, ended: g.ended})
	}
	slices.SortStableFunc(out, func(a, b linkGet) int { return int(a.ended - b.ended) })
	return out
}

// serve carries the link's units, round robin over the GETs whose first
// byte may go.
func (l *sharedLink) serve() {
	select {
	case <-l.go_:
	case <-l.stop:
		return
	}
	cursor := -1
	for {
		g, i := l.next(cursor)
		if g == nil {
			select {
			case <-l.wake:
				continue
			case <-l.stop:
				return
			}
		}
		cursor = i
		n := min(l.unit, g.length-g.given)
		unit := l.data[g.off+g.given : g.off+g.given+n]
		select {
		case g.grants <- unit:
		case <-g.ctx.Done():
			l.finish(g, false)
			continue
		case <-l.stop:
			return
		}
		l.mu.Lock()
		l.carried += n
		g.given += n
		l.mu.Unlock()
		if g.given == g.length {
			l.finish(g, true)
		}
	}
}

// finish stops serving g; ended says it got all its bytes.
func (l *sharedLink) finish(g *linkGet, ended bool) {
	l.mu.Lock()
	if ended {
		g.ended = l.carried
	}
	l.mu.Unlock()
	close(g.gone)
	close(g.grants)
}

// next is the GET after cursor, round robin, whose first byte may go; if
// none may yet but some wait, the link idles until the first of them may.
func (l *sharedLink) next(cursor int) (*linkGet, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	waiting := int64(-1)
	for k := 1; k <= len(l.gets); k++ {
		i := (cursor + k) % len(l.gets)
		g := l.gets[i]
		if g.given == g.length || isClosed(g.gone) {
			continue
		}
		if g.joinAt <= l.carried {
			return g, i
		}
		if waiting < 0 || g.joinAt < waiting {
			waiting = g.joinAt
		}
	}
	if waiting < 0 {
		return nil, cursor
	}
	l.carried = waiting
	for k := 1; k <= len(l.gets); k++ {
		i := (cursor + k) % len(l.gets)
		if g := l.gets[i]; g.given < g.length && !isClosed(g.gone) && g.joinAt <= l.carried {
			return g, i
		}
	}
	return nil, cursor
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (g *linkGet) Read(p []byte) (int, error) {
	if len(g.left) == 0 {
		select {
		case unit, ok := <-g.grants:
			if !ok {
				return 0, io.EOF
			}
			g.left = unit
		case <-g.ctx.Done():
			return 0, g.ctx.Err()
		}
	}
	n := copy(p, g.left)
	g.left = g.left[n:]
	return n, nil
}

func (g *linkGet) Close() error { return nil }
