package chunkcache

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
)

func TestPlan(t *testing.T) {
	const bs = 100
	cases := []struct {
		name   string
		ranges []Range
		size   int64
		cap    int64
		want   []Run
	}{
		{"empty", nil, 1000, 300, nil},
		{"one range inside a block", []Range{{10, 20}}, 1000, 300, []Run{{0, 1}}},
		{"range across blocks", []Range{{150, 200}}, 1000, 300, []Run{{1, 3}}},
		{"first-touch order kept", []Range{{500, 10}, {100, 10}}, 1000, 300, []Run{{5, 1}, {1, 1}}},
		{"later neighbour rides along", []Range{{100, 10}, {500, 10}, {200, 10}}, 1000, 300, []Run{{1, 2}, {5, 1}}},
		{"earlier neighbour does not", []Range{{200, 10}, {100, 10}}, 1000, 300, []Run{{2, 1}, {1, 1}}},
		{"cap splits a long run", []Range{{0, 700}}, 1000, 300, []Run{{0, 3}, {3, 3}, {6, 1}}},
		{"cap below a block is one block", []Range{{0, 300}}, 1000, 50, []Run{{0, 1}, {1, 1}, {2, 1}}},
		{"gap ends a run", []Range{{0, 10}, {200, 10}}, 1000, 300, []Run{{0, 1}, {2, 1}}},
		{"repeat touches count once", []Range{{0, 10}, {50, 10}, {0, 10}}, 1000, 300, []Run{{0, 1}}},
		{"clipped at the end", []Range{{950, 100}}, 1000, 300, []Run{{9, 1}}},
		{"short last block", []Range{{900, 50}}, 950, 300, []Run{{9, 1}}},
		{"zero length skipped", []Range{{300, 0}}, 1000, 300, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Plan(tc.ranges, tc.size, bs, tc.cap)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Plan = %v, want %v", got, tc.want)
			}
		})
	}
	for _, bad := range [][]Range{{{-1, 10}}, {{0, -1}}, {{2000, 1}}} {
		if _, err := Plan(bad, 1000, bs, 300); err == nil {
			t.Errorf("Plan(%v) accepted", bad)
		}
	}
}

// TestWarmAndDemandJoin holds the warming's first GET in flight, reads a
// block it is fetching, and checks the read waits for that GET instead of
// sending its own.
func TestWarmAndDemandJoin(t *testing.T) {
	o := newOrigin(t, 16*testBlock)
	o.gate = make(chan struct{})
	o.started = make(chan int64, 16)
	c := openCache(t, t.TempDir(), 64<<20)
	obj := o.object("obj")
	// Blocks 4..7 then 0..1, in that order of first touch; runs capped at
	// 4 blocks.
	ranges := []Range{{4 * testBlock, 4 * testBlock}, {0, 2 * testBlock}}
	w, err := c.Warm(obj, ranges, WarmOptions{Concurrency: 1, RunCapBytes: 4 * testBlock})
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Runs(); !reflect.DeepEqual(got, []Run{{4, 4}, {0, 2}}) {
		t.Fatalf("runs %v", got)
	}
	if off := <-o.started; off != 4*testBlock {
		t.Fatalf("first GET at %d, want the first-touch run at %d", off, 4*testBlock)
	}
	r := openReader(t, c, obj)
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 1000)
		_, err := r.ReadAt(buf, 6*testBlock+5)
		if err == nil && string(buf) != string(o.data[6*testBlock+5:6*testBlock+1005]) {
			err = errors.New("wrong bytes")
		}
		done <- err
	}()
	waitFor(t, "the demand read to join the run", func() bool { return c.Stats().Joins == 1 })
	close(o.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-w.Done()
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	if got := o.fetches.Load(); got != 2 {
		t.Fatalf("%d GETs, want 2 (one per run, none for the demand read)", got)
	}
	s := w.Stats()
	if s.Gets != 2 || s.FetchedBlocks != 6 {
		t.Fatalf("warm stats %+v", s)
	}
	for i := range int64(8) {
		if want := i < 2 || i >= 4; c.Cached("obj", i) != want {
			t.Fatalf("block %d cached=%v after warming", i, !want)
		}
	}
}

// TestWarmSkipsCachedBlocks splits runs around blocks already cached.
func TestWarmSkipsCachedBlocks(t *testing.T) {
	o := newOrigin(t, 8*testBlock)
	c := openCache(t, t.TempDir(), 64<<20)
	obj := o.object("obj")
	readCheck(t, openReader(t, c, obj), o, 2*testBlock, testBlock)
	before := o.fetches.Load()
	w, err := c.Warm(obj, []Range{{0, 6 * testBlock}}, WarmOptions{RunCapBytes: 8 * testBlock})
	if err != nil {
		t.Fatal(err)
	}
	<-w.Done()
	s := w.Stats()
	if s.Runs != 1 || s.Gets != 2 || s.SkippedBlocks != 1 || s.FetchedBlocks != 5 {
		t.Fatalf("warm stats %+v, want 1 run split into 2 GETs around 1 cached block", s)
	}
	if got := o.fetches.Load() - before; got != 2 {
		t.Fatalf("%d GETs", got)
	}
}

// TestStoppedWarmReleasesWaiters stops a warming while a demand read waits
// on its GET: the warming ends, and its GET goes on for the read, which
// succeeds without a GET of its own.
func TestStoppedWarmReleasesWaiters(t *testing.T) {
	o := newOrigin(t, 4*testBlock)
	o.gate = make(chan struct{})
	o.started = make(chan int64, 16)
	c := openCache(t, t.TempDir(), 64<<20)
	obj := o.object("obj")
	w, err := c.Warm(obj, []Range{{0, 4 * testBlock}}, WarmOptions{})
	if err != nil {
		t.Fatal(err)
	}
	<-o.started
	r := openReader(t, c, obj)
	done := make(chan error, 1)
	go func() {
		_, err := r.ReadAt(make([]byte, 10), testBlock)
		done <- err
	}()
	waitFor(t, "the demand read to join the run", func() bool { return c.Stats().Joins == 1 })
	w.Stop()
	if err := w.Err(); err != nil {
		t.Fatalf("a stopped warming reports %v", err)
	}
	close(o.gate)
	if err := <-done; err != nil {
		t.Fatalf("read after the warming stopped: %v", err)
	}
	if got := o.fetches.Load(); got != 1 {
		t.Fatalf("%d GETs, want the warming's one", got)
	}
	readCheck(t, r, o, testBlock, 10)
}

func TestWarmFailureEndsIt(t *testing.T) {
	o := newOrigin(t, 32*testBlock)
	boom := fmt.Errorf("store gone")
	o.fail.Store(&boom)
	c := openCache(t, t.TempDir(), 64<<20)
	w, err := c.Warm(o.object("obj"), []Range{{0, 32 * testBlock}}, WarmOptions{RunCapBytes: testBlock, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	<-w.Done()
	if !errors.Is(w.Err(), boom) {
		t.Fatalf("Err = %v", w.Err())
	}
	if got := o.fetches.Load(); got > 2 {
		t.Fatalf("%d GETs after the first failed, want the warming to stop", got)
	}
	if s := c.Stats(); s.Blocks != 0 {
		t.Fatalf("failed warming cached %d blocks", s.Blocks)
	}
}

// TestWarmArrival: a warming says when its first block arrived and when it
// ended, and not before.
func TestWarmArrival(t *testing.T) {
	o := newOrigin(t, 4*testBlock)
	o.gate = make(chan struct{})
	c := openCache(t, t.TempDir(), 64<<20)
	w, err := c.Warm(o.object("obj"), []Range{{0, 4 * testBlock}}, WarmOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if first, ended := w.Arrival(); !first.IsZero() || !ended.IsZero() {
		t.Fatalf("before any block: first %v, ended %v", first, ended)
	}
	close(o.gate)
	<-w.Done()
	first, ended := w.Arrival()
	if first.IsZero() || ended.IsZero() || ended.Before(first) {
		t.Fatalf("after the warming: first block %v, ended %v", first, ended)
	}
}

// TestRamp: the plan is re-cut, front first, into heads that grow by one
// block each (1, 2, .., workers blocks) and then runs of the cap; a head
// or run only spans blocks that are consecutive both in the plan and in
// the object; every block is still planned exactly once.
func TestRamp(t *testing.T) {
	runs := func(n, count int64) []Run {
		var rs []Run
		for i := range n {
			rs = append(rs, Run{First: i * count, Count: count})
		}
		return rs
	}
	cases := []struct {
		name      string
		in        []Run
		workers   int
		capBlocks int64
		want      []Run
	}{
		{"six workers over runs of two", runs(18, 2), 6, 2, []Run{
			{0, 1}, {1, 2}, {3, 3}, {6, 4}, {10, 5}, {15, 6}, // heads: 1 .. 6 blocks
			{21, 2}, {23, 2}, {25, 2}, {27, 2}, {29, 2}, {31, 2}, {33, 2}, {35, 1}}},
		{"runs of one block grow too", runs(6, 1), 3, 1, []Run{{0, 1}, {1, 2}, {3, 3}}},
		{"a gap ends a head", []Run{{0, 2}, {5, 2}, {7, 2}}, 3, 2, []Run{{0, 1}, {1, 1}, {5, 3}, {8, 1}}},
		{"plan order is kept", []Run{{4, 2}, {0, 2}}, 2, 2, []Run{{4, 1}, {5, 1}, {0, 2}}},
		{"fewer blocks than the heads", []Run{{0, 2}, {2, 1}}, 6, 2, []Run{{0, 1}, {1, 2}}},
		{"one worker: nothing to stagger", runs(3, 4), 1, 4, runs(3, 4)},
		{"empty plan", nil, 4, 2, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Ramp(tc.in, tc.workers, tc.capBlocks)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Ramp(%v, %d, %d) = %v, want %v", tc.in, tc.workers, tc.capBlocks, got, tc.want)
			}
			if blocksOf(got) != blocksOf(tc.in) {
				t.Errorf("blocks planned %v, want %v", blocksOf(got), blocksOf(tc.in))
			}
		})
	}
}

// blocksOf is the sorted list of every block a plan fetches, as a string.
func blocksOf(rs []Run) string {
	var bs []int64
	for _, r := range rs {
		for b := r.First; b < r.First+r.Count; b++ {
			bs = append(bs, b)
		}
	}
	slices.Sort(bs)
	return fmt.Sprint(bs)
}
