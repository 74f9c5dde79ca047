package prefetch

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// offsetsOf returns the offsets of plan's reads at the given ranks.
func offsetsOf(plan []Range, ranks ...int) []int64 {
	out := make([]int64, len(ranks))
	for i, r := range ranks {
		out[i] = plan[r].Offset
	}
	return out
}

// fetchedOffsets is the offset of every read the probe saw, in order.
func fetchedOffsets(p *probe) []int64 {
	var out []int64
	for _, f := range p.recorded() {
		out = append(out, f.off)
	}
	return out
}

// followTask joins a following one-reader task over plan whose reads are
// held at p's gate, and waits for its first read (rank 0) to be held.
func followTask(t *testing.T, p *probe, plan []Range, follow bool) (*Engine, *Subscription) {
	t.Helper()
	p.gate = newGate()
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	s := e.Join(key(1), p, plan, TaskOptions{Follow: follow})
	if got := <-p.gate.entered; got != plan[0].Offset {
		t.Fatalf("first read at %d; want the plan's first, %d", got, plan[0].Offset)
	}
	return e, s
}

// expectCompleted waits for s and checks it completed having fetched the
// whole plan, and that the probe read exactly order.
func expectCompleted(t *testing.T, s *Subscription, p *probe, plan []Range, order []int64) {
	t.Helper()
	<-s.Done()
	if s.State() != Completed || s.Err() != nil {
		t.Fatalf("state %v, err %v; want completed", s.State(), s.Err())
	}
	if got := fetchedOffsets(p); !slices.Equal(got, order) {
		t.Errorf("reads at %v; want %v", got, order)
	}
	var total int64
	for _, r := range plan {
		total += r.Length
	}
	if s.BytesFetched() != total {
		t.Errorf("fetched %d bytes; want the plan's %d", s.BytesFetched(), total)
	}
}

// A fault ahead of the cursor moves it there: the read holding the page
// is next, then the ones after it, and the reads jumped over come after
// the end of the plan, in plan order.
func TestFollowJumpsToTheFault(t *testing.T) {
	p := newProbe(t, 1<<20)
	plan := pages(0, 10)
	e, s := followTask(t, p, plan, true)
	// A fault in the middle of read 5's page.
	s.Follow(plan[5].Offset+100, 1)
	close(p.gate.release)
	expectCompleted(t, s, p, plan, offsetsOf(plan, 0, 5, 6, 7, 8, 9, 1, 2, 3, 4))
	if st := e.Stats(); st.Jumps != 1 || st.DeferredReads != 4 {
		t.Errorf("jumps %d, deferred reads %d; want 1 and 4", st.Jumps, st.DeferredReads)
	}
}

// Faults behind the cursor, on a read already claimed, outside the plan,
// or not a range at all change nothing.
func TestFollowIgnoresFaultsItCannotUse(t *testing.T) {
	p := newProbe(t, 1<<20)
	plan := pages(0, 10) // one page every other page
	e, s := followTask(t, p, plan, true)
	s.Follow(plan[0].Offset, testBufferBytes)           // the read in progress
	s.Follow(plan[3].Offset+testBufferBytes, 4096)      // the gap after read 3: outside the plan
	s.Follow(plan[9].Offset+2*testBufferBytes, 1<<20)   // past the plan's end
	s.Follow(plan[4].Offset, 0)                         // an empty range
	s.Follow(-testBufferBytes, 2*testBufferBytes)       // a negative offset
	s.Follow(math.MaxInt64-10, testBufferBytes)         // an overflowing range
	s.Follow(plan[4].Offset, testBufferBytes)           // ahead: the one jump
	p.gate.release <- struct{}{}                        // read 0 returns
	if got := <-p.gate.entered; got != plan[4].Offset { // the reader claims read 4
		t.Fatalf("read after the jump at %d; want read 4 at %d", got, plan[4].Offset)
	}
	s.Follow(plan[2].Offset, testBufferBytes) // behind the cursor
	s.Follow(plan[4].Offset, testBufferBytes) // claimed
	close(p.gate.release)
	expectCompleted(t, s, p, plan, offsetsOf(plan, 0, 4, 5, 6, 7, 8, 9, 1, 2, 3))
	if st := e.Stats(); st.Jumps != 1 {
		t.Errorf("%d jumps; want 1", st.Jumps)
	}
}

// A request covering several reads (a fault and its readaround) moves the
// cursor to the earliest-ranked of them not yet claimed, wherever it lies
// in memory.
func TestFollowTakesTheEarliestRankInARequest(t *testing.T) {
	p := newProbe(t, 1<<20)
	// Ranks 0..7 placed in memory in reverse order, one page apart.
	var plan []Range
	for i := 7; i >= 0; i-- {
		plan = append(plan, Range{Offset: int64(i) * 2 * testBufferBytes, Length: testBufferBytes})
	}
	_, s := followTask(t, p, plan, true)
	// Covers ranks 5, 4 and 3 (offsets 4, 6 and 8 pages) and the gaps.
	s.Follow(plan[5].Offset, int(plan[3].Offset-plan[5].Offset)+testBufferBytes)
	close(p.gate.release)
	expectCompleted(t, s, p, plan, offsetsOf(plan, 0, 3, 4, 5, 6, 7, 1, 2))
}

// A task that does not follow reads in plan order whatever the guest does,
// and an ended task ignores Follow.
func TestFollowOffReadsInPlanOrder(t *testing.T) {
	p := newProbe(t, 1<<20)
	plan := pages(0, 6)
	e, s := followTask(t, p, plan, false)
	s.Follow(plan[4].Offset, testBufferBytes)
	close(p.gate.release)
	expectCompleted(t, s, p, plan, offsetsOf(plan, 0, 1, 2, 3, 4, 5))
	s.Follow(plan[5].Offset, testBufferBytes)
	if st := e.Stats(); st.Jumps != 0 || st.DeferredReads != 0 {
		t.Errorf("jumps %d, deferred reads %d; want none", st.Jumps, st.DeferredReads)
	}
}

// Reads jumped over are not read when the task ends first.
func TestFollowDeferredReadsDroppedOnCancel(t *testing.T) {
	p := newProbe(t, 1<<20)
	plan := pages(0, 8)
	e, s := followTask(t, p, plan, true)
	s.Follow(plan[6].Offset, testBufferBytes)
	p.gate.release <- struct{}{} // read 0
	<-p.gate.entered             // read 6 held
	left := s.Leave()
	close(p.gate.release)
	<-left
	if s.State() != Cancelled {
		t.Fatalf("state %v; want cancelled", s.State())
	}
	if got, want := fetchedOffsets(p), offsetsOf(plan, 0, 6); !slices.Equal(got, want) {
		t.Errorf("reads at %v; want %v and none of the reads jumped over", got, want)
	}
	if st := e.Stats(); st.DeferredReads != 0 {
		t.Errorf("%d deferred reads started after the cancel", st.DeferredReads)
	}
}

// However readers, jumps and the pass after the end race, every read of
// the plan is done exactly once: none twice, none lost.
func TestFollowReadsEveryRangeOnce(t *testing.T) {
	for _, readers := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("%d readers", readers), func(t *testing.T) {
			for round := range 4 {
				checkEveryRangeOnce(t, readers, uint64(round))
			}
		})
	}
}

func checkEveryRangeOnce(t *testing.T, readers int, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, uint64(readers)))
	const n = 300
	plan := pages(0, n) // 600 pages of memory: 2.3 MiB
	rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	p := newProbe(t, 4<<20)
	p.gate = newGate()
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	s := e.Join(key(1), p, plan, TaskOptions{Follow: true, Readers: readers})
	// One jump for certain: the reads are held at the gate at the start
	// of the plan while a guest faults its last range.
	<-p.gate.entered
	s.Follow(plan[n-1].Offset, 1)
	close(p.gate.release)
	// Guests fault at random for as long as the task runs.
	var faults sync.WaitGroup
	for g := range 3 {
		frng := rand.New(rand.NewPCG(seed, uint64(g)))
		faults.Go(func() {
			for !isClosed(s.Done()) {
				off := frng.Int64N(2 * n * testBufferBytes)
				s.Follow(off, 1+frng.IntN(8*testBufferBytes))
			}
		})
	}
	faults.Wait()
	if s.State() != Completed {
		t.Fatalf("state %v, err %v; want completed", s.State(), s.Err())
	}
	got := p.spans()
	want := slices.Clone(plan)
	byOffset := func(a, b Range) int { return int(a.Offset - b.Offset) }
	slices.SortFunc(got, byOffset)
	slices.SortFunc(want, byOffset)
	if !slices.Equal(got, want) {
		t.Fatalf("%d readers: %d reads done, want each of the plan's %d exactly once", readers, len(got), len(want))
	}
	if e.Stats().Jumps == 0 {
		t.Errorf("no fault moved the cursor")
	}
	if s.BytesFetched() != n*testBufferBytes {
		t.Errorf("fetched %d bytes; want %d", s.BytesFetched(), n*testBufferBytes)
	}
}

// A task shared by two consumers follows whichever guest faults ahead of
// its cursor; a fault behind it, from the guest that lags, changes nothing.
func TestFollowSharedTaskFollowsEitherGuest(t *testing.T) {
	p := newProbe(t, 1<<20)
	plan := pages(0, 10)
	e, a := followTask(t, p, plan, true)
	b := e.Join(key(1), p, plan, TaskOptions{Follow: true})
	if a.Done() != b.Done() {
		t.Fatal("the second Join did not share the task")
	}
	b.Follow(plan[3].Offset, testBufferBytes)
	a.Follow(plan[6].Offset, testBufferBytes)
	b.Follow(plan[4].Offset, testBufferBytes) // behind the cursor now
	close(p.gate.release)
	expectCompleted(t, b, p, plan, offsetsOf(plan, 0, 6, 7, 8, 9, 1, 2, 3, 4, 5))
	if st := e.Stats(); st.Jumps != 2 || st.TasksStarted != 1 {
		t.Errorf("jumps %d, tasks %d; want 2 jumps of one task", st.Jumps, st.TasksStarted)
	}
}
