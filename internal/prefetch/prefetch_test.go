package prefetch

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

const testBufferBytes = 4096

// memoryFile writes size bytes of reproducible content to a temp file and
// returns it open for reading, with its content to check reads against.
func memoryFile(tb testing.TB, size int) (*os.File, []byte) {
	tb.Helper()
	content := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{7})
	_, _ = rng.Read(content)
	path := filepath.Join(tb.TempDir(), "memory")
	if err := os.WriteFile(path, content, 0o600); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	return f, content
}

// gate holds every Fetch that passes it until the test releases it: one
// token per read, or all at once by closing release.
type gate struct {
	entered chan int64 // offset of each Fetch that reached the gate
	release chan struct{}
	// honourCtx makes a held Fetch return ctx's error when ctx is cancelled,
	// as a target that can be interrupted would.
	honourCtx bool
}

func newGate() *gate {
	return &gate{entered: make(chan int64, 1024), release: make(chan struct{})}
}

type fetch struct {
	off int64
	n   int
	buf *byte // first byte of the buffer, to tell buffers apart
}

// probe wraps a real read of a file with checks: it records each Fetch,
// verifies the bytes read, counts reads in progress, and may hold reads at
// a gate. One probe may serve several tasks.
type probe struct {
	tb     testing.TB
	target Target
	want   []byte
	gate   *gate

	mu      sync.Mutex
	fetches []fetch

	inFlight, maxInFlight, returned atomic.Int64
}

func newProbe(tb testing.TB, size int) *probe {
	f, content := memoryFile(tb, size)
	return &probe{tb: tb, target: ReaderTarget(f), want: content}
}

func (p *probe) Fetch(ctx context.Context, off int64, buf []byte) error {
	n := p.inFlight.Add(1)
	for m := p.maxInFlight.Load(); n > m && !p.maxInFlight.CompareAndSwap(m, n); m = p.maxInFlight.Load() {
	}
	defer p.inFlight.Add(-1)
	defer p.returned.Add(1)
	p.mu.Lock()
	p.fetches = append(p.fetches, fetch{off: off, n: len(buf), buf: &buf[0]})
	p.mu.Unlock()
	if g := p.gate; g != nil {
		g.entered <- off
		if g.honourCtx {
			select {
			case <-g.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		} else {
			<-g.release
		}
	}
	err := p.target.Fetch(ctx, off, buf)
	if err == nil && !bytes.Equal(buf, p.want[off:off+int64(len(buf))]) {
		p.tb.Errorf("fetch at %d length %d: bytes differ from the file", off, len(buf))
	}
	return err
}

func (p *probe) recorded() []fetch {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.fetches)
}

// spans returns the recorded reads without buffer identities.
func (p *probe) spans() []Range {
	var out []Range
	for _, f := range p.recorded() {
		out = append(out, Range{f.off, int64(f.n)})
	}
	return out
}

// pages returns n ranges of one page each, in order from off.
func pages(off int64, n int) []Range {
	rs := make([]Range, n)
	for i := range rs {
		rs[i] = Range{Offset: off + int64(i)*2*testBufferBytes, Length: testBufferBytes}
	}
	return rs
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func key(gen uint64) Key { return Key{Generation: gen, Digest: "sha256:test"} }

func TestSharedByKey(t *testing.T) {
	const consumers = 8
	p := newProbe(t, 1<<20)
	p.gate = newGate()
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	plan := pages(0, 16)

	subs := make([]*Subscription, consumers)
	var joined sync.WaitGroup
	for i := range subs {
		joined.Go(func() { subs[i] = e.Join(key(1), p, plan, TaskOptions{}) })
	}
	joined.Wait()
	<-p.gate.entered // the one task holds its first read until every Join has returned
	close(p.gate.release)
	for _, s := range subs {
		<-s.Done()
		if s.State() != Completed || s.Err() != nil {
			t.Fatalf("state %v, err %v; want completed", s.State(), s.Err())
		}
	}
	st := e.Stats()
	if st.TasksStarted != 1 || st.TasksCompleted != 1 {
		t.Errorf("tasks started %d completed %d; want 1 and 1", st.TasksStarted, st.TasksCompleted)
	}
	if st.MaxReadersInFlight > DefaultMaxReaders || p.maxInFlight.Load() > DefaultMaxReaders {
		t.Errorf("readers in flight reached %d (probe %d); want at most %d", st.MaxReadersInFlight, p.maxInFlight.Load(), DefaultMaxReaders)
	}
	if got := p.spans(); !slices.Equal(got, plan) {
		t.Errorf("reads %v; want each range once, in order: %v", got, plan)
	}
	if st.BytesFetched != uint64(16*testBufferBytes) || subs[0].BytesFetched() != 16*testBufferBytes {
		t.Errorf("bytes fetched %d (task %d); want %d", st.BytesFetched, subs[0].BytesFetched(), 16*testBufferBytes)
	}
}

func TestReaderLimitAcrossTasks(t *testing.T) {
	const tasks = 8
	p := newProbe(t, 1<<20)
	p.gate = newGate()
	e := NewEngine(Options{BufferBytes: testBufferBytes})

	subs := make([]*Subscription, tasks)
	for i := range subs {
		subs[i] = e.Join(key(uint64(i)), p, pages(int64(i)*64*1024, 4), TaskOptions{})
	}
	for range DefaultMaxReaders {
		<-p.gate.entered
	}
	if n := e.Stats().ReadersInFlight; n != DefaultMaxReaders {
		t.Errorf("engine counts %d readers in flight with %d reads held; want %d", n, DefaultMaxReaders, DefaultMaxReaders)
	}
	close(p.gate.release)
	for _, s := range subs {
		<-s.Done()
		if s.State() != Completed {
			t.Fatalf("task %v: state %v, err %v", s.Key(), s.State(), s.Err())
		}
	}
	st := e.Stats()
	if st.TasksStarted != tasks || st.TasksCompleted != tasks {
		t.Errorf("tasks started %d completed %d; want %d", st.TasksStarted, st.TasksCompleted, tasks)
	}
	if st.MaxReadersInFlight != DefaultMaxReaders || p.maxInFlight.Load() != DefaultMaxReaders {
		t.Errorf("max readers in flight %d (probe %d); want exactly %d", st.MaxReadersInFlight, p.maxInFlight.Load(), DefaultMaxReaders)
	}
	if st.ReadersInFlight != 0 || st.Fetches != tasks*4 {
		t.Errorf("after the end: %d readers in flight, %d fetches; want 0 and %d", st.ReadersInFlight, st.Fetches, tasks*4)
	}
}

// TestReadSlotsInterleaveTasks shows why the reader limit is taken per read:
// with one slot, two tasks alternate instead of the first running to its end.
func TestReadSlotsInterleaveTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newProbe(t, 1<<20)
		p.gate = newGate()
		e := NewEngine(Options{MaxReaders: 1, BufferBytes: testBufferBytes})
		a := e.Join(key(1), p, pages(0, 3), TaskOptions{})
		first := <-p.gate.entered
		b := e.Join(key(2), p, pages(512*1024, 3), TaskOptions{})
		synctest.Wait() // b's reader is now waiting for the slot a holds
		order := []int64{first}
		for range 5 {
			synctest.Wait() // the other task's reader is waiting for the slot
			p.gate.release <- struct{}{}
			order = append(order, <-p.gate.entered)
		}
		p.gate.release <- struct{}{}
		<-a.Done()
		<-b.Done()
		want := []int64{0, 512 * 1024, 8192, 512*1024 + 8192, 16384, 512*1024 + 16384}
		if !slices.Equal(order, want) {
			t.Errorf("read order %v; want the tasks alternating %v", order, want)
		}
	})
}

func TestOneConsumerLeaving(t *testing.T) {
	p := newProbe(t, 1<<20)
	p.gate = newGate()
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	plan := pages(0, 8)
	a := e.Join(key(1), p, plan, TaskOptions{})
	b := e.Join(key(1), p, plan, TaskOptions{})
	<-p.gate.entered

	if left := a.Leave(); !isClosed(left) {
		t.Error("Leave of a consumer that is not the last should not wait for the task's reads")
	}
	close(p.gate.release)
	<-b.Done()
	if b.State() != Completed || a.State() != Completed {
		t.Errorf("states %v and %v; want completed for both", a.State(), b.State())
	}
	if got := p.spans(); !slices.Equal(got, plan) {
		t.Errorf("reads %v; want the whole plan %v", got, plan)
	}
	if st := e.Stats(); st.TasksStarted != 1 || st.TasksCancelled != 0 {
		t.Errorf("tasks started %d cancelled %d; want 1 and 0", st.TasksStarted, st.TasksCancelled)
	}
}

func TestLastConsumerLeavingCancelsQueuedReads(t *testing.T) {
	p := newProbe(t, 1<<20)
	p.gate = newGate()
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	s := e.Join(key(1), p, pages(0, 8), TaskOptions{})
	<-p.gate.entered
	if s.State() != Running {
		t.Fatalf("state %v while a read is held; want running", s.State())
	}

	drained := s.Leave()
	if isClosed(drained) || isClosed(s.Done()) {
		t.Fatal("Leave's channel closed while a read was still in progress")
	}
	if s.Leave() != drained {
		t.Error("a second Leave returned a different channel")
	}
	if s.State().Ended() {
		t.Errorf("state %v while a read is still in progress; want not ended", s.State())
	}
	close(p.gate.release) // a wrongly started read would pass the gate and be recorded
	<-drained
	if n := p.returned.Load(); n != 1 {
		t.Errorf("%d reads returned when the drain channel closed; want the held one", n)
	}
	if got := p.recorded(); len(got) != 1 {
		t.Errorf("reads %v; want none after the held one", got)
	}
	if s.State() != Cancelled || !errors.Is(s.Err(), ErrCancelled) {
		t.Errorf("state %v, err %v; want cancelled", s.State(), s.Err())
	}
	if st := e.Stats(); st.TasksCancelled != 1 || st.ReadersInFlight != 0 {
		t.Errorf("tasks cancelled %d, readers in flight %d; want 1 and 0", st.TasksCancelled, st.ReadersInFlight)
	}
	if s.BytesFetched() != testBufferBytes {
		t.Errorf("task fetched %d bytes; want the held read's %d", s.BytesFetched(), testBufferBytes)
	}
}

func TestLeavingCancelsReadWaitingForSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newProbe(t, 1<<20)
		p.gate = newGate()
		e := NewEngine(Options{MaxReaders: 1, BufferBytes: testBufferBytes})
		holder := e.Join(key(1), p, pages(0, 2), TaskOptions{})
		<-p.gate.entered
		waiter := e.Join(key(2), p, pages(512*1024, 2), TaskOptions{})
		synctest.Wait() // waiter's reader is blocked on the slot
		if waiter.State() != Queued {
			t.Fatalf("waiting task is %v; want queued", waiter.State())
		}
		<-waiter.Leave() // must not wait for the holder's read
		if waiter.State() != Cancelled {
			t.Errorf("state %v; want cancelled", waiter.State())
		}
		if holder.State() != Running {
			t.Errorf("holder is %v; want still running", holder.State())
		}
		close(p.gate.release)
		<-holder.Done()
		if holder.State() != Completed {
			t.Errorf("holder ended %v; want completed", holder.State())
		}
		for _, f := range p.recorded() {
			if f.off >= 512*1024 {
				t.Errorf("cancelled task read at %d", f.off)
			}
		}
	})
}

func TestJoinWhileLastReadDrainsStartsNewTask(t *testing.T) {
	p := newProbe(t, 1<<20)
	p.gate = newGate()
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	old := e.Join(key(1), p, pages(0, 4), TaskOptions{})
	<-p.gate.entered
	drained := old.Leave()
	fresh := e.Join(key(1), p, pages(0, 4), TaskOptions{})
	close(p.gate.release)
	<-drained
	<-fresh.Done()
	if old.State() != Cancelled || fresh.State() != Completed {
		t.Errorf("old %v, fresh %v; want cancelled and completed", old.State(), fresh.State())
	}
	if st := e.Stats(); st.TasksStarted != 2 {
		t.Errorf("tasks started %d; want 2: a cancelling task is not shared", st.TasksStarted)
	}
}

func TestCompletionNotification(t *testing.T) {
	p := newProbe(t, 1<<20)
	p.gate = newGate()
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	plan := pages(0, 4)
	s := e.Join(key(1), p, plan, TaskOptions{})
	<-p.gate.entered
	if isClosed(s.Done()) || s.State() != Running || s.Err() != nil {
		t.Fatalf("mid-task: done %v, state %v, err %v", isClosed(s.Done()), s.State(), s.Err())
	}
	close(p.gate.release)
	<-s.Done()
	if !isClosed(s.Done()) || s.State() != Completed || s.Err() != nil {
		t.Fatalf("after the end: done %v, state %v, err %v", isClosed(s.Done()), s.State(), s.Err())
	}
	if err := s.Wait(context.Background()); err != nil {
		t.Errorf("Wait after the end: %v", err)
	}

	late := e.Join(key(1), p, plan, TaskOptions{})
	if !isClosed(late.Done()) || late.State() != Completed || late.Err() != nil {
		t.Errorf("late subscriber: done %v, state %v, err %v; want the completed outcome", isClosed(late.Done()), late.State(), late.Err())
	}
	if !isClosed(late.Leave()) || !isClosed(s.Leave()) {
		t.Error("leaving an ended task should not wait")
	}
	if st := e.Stats(); st.TasksStarted != 1 || st.Fetches != uint64(len(plan)) {
		t.Errorf("tasks started %d, fetches %d; want 1 and %d: a completed key is not read again", st.TasksStarted, st.Fetches, len(plan))
	}
}

func TestForget(t *testing.T) {
	p := newProbe(t, 1<<20)
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	plan := pages(0, 2)
	<-e.Join(key(1), p, plan, TaskOptions{}).Done()
	<-e.Join(key(2), p, plan, TaskOptions{}).Done()
	e.Forget("", 2)
	<-e.Join(key(1), p, plan, TaskOptions{}).Done()
	if st := e.Stats(); st.TasksStarted != 2 {
		t.Fatalf("tasks started %d; want 2: generation 1 was not forgotten", st.TasksStarted)
	}
	e.Forget("", 1)
	s := e.Join(key(1), p, plan, TaskOptions{})
	<-s.Done()
	if st := e.Stats(); st.TasksStarted != 3 || s.State() != Completed {
		t.Errorf("tasks started %d, state %v; want a new task after Forget", st.TasksStarted, s.State())
	}
}

func TestFailure(t *testing.T) {
	const fileBytes = 64 * 1024
	f, _ := memoryFile(t, fileBytes)
	closed, _ := memoryFile(t, fileBytes)
	closed.Close()
	tests := []struct {
		name    string
		target  Target
		plan    []Range
		want    error
		wantMsg string
		reads   int // fetches expected, the failing one included
	}{
		{
			name:    "past end of file",
			target:  ReaderTarget(f),
			plan:    []Range{{0, 4096}, {fileBytes, 4096}, {4096, 4096}},
			want:    io.ErrUnexpectedEOF,
			wantMsg: "[65536, 69632)",
			reads:   2,
		},
		{
			name:    "closed file",
			target:  ReaderTarget(closed),
			plan:    []Range{{8192, 100}, {0, 4096}},
			want:    os.ErrClosed,
			wantMsg: "[8192, 8292)",
			reads:   1,
		},
		{name: "negative offset", target: ReaderTarget(f), plan: []Range{{0, 4096}, {-4096, 4096}}, want: ErrInvalidRange},
		{name: "negative length", target: ReaderTarget(f), plan: []Range{{0, -1}}, want: ErrInvalidRange},
		{name: "overflow", target: ReaderTarget(f), plan: []Range{{1 << 62, 1 << 62}, {1 << 62, 1<<62 - 1}}, want: ErrInvalidRange},
		{name: "no target", plan: []Range{{0, 4096}}, want: ErrNoTarget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := NewEngine(Options{BufferBytes: testBufferBytes})
			var reads atomic.Int64
			var target Target
			if tt.target != nil {
				target = TargetFunc(func(ctx context.Context, off int64, buf []byte) error {
					reads.Add(1)
					return tt.target.Fetch(ctx, off, buf)
				})
			}
			s := e.Join(key(1), target, tt.plan, TaskOptions{})
			<-s.Done()
			err := s.Err()
			if s.State() != Failed || !errors.Is(err, tt.want) {
				t.Fatalf("state %v, err %v; want failed with %v", s.State(), err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) || !strings.Contains(err.Error(), "generation 1") {
				t.Errorf("error %q does not name the range %s and the key", err, tt.wantMsg)
			}
			if n := reads.Load(); n != int64(tt.reads) {
				t.Errorf("%d reads; want %d, none after the failure", n, tt.reads)
			}
			// A failed key is not shared: the next restore tries again.
			<-e.Join(key(1), target, tt.plan, TaskOptions{}).Done()
			if st := e.Stats(); st.TasksStarted != 2 || st.TasksFailed != 2 {
				t.Errorf("tasks started %d failed %d; want 2 and 2", st.TasksStarted, st.TasksFailed)
			}
		})
	}
}

// With two readers, a failure in one cancels the other's read in progress
// (its target honours cancellation) and no further read starts.
func TestFailureStopsOtherReaders(t *testing.T) {
	const fileBytes = 64 * 1024
	f, _ := memoryFile(t, fileBytes)
	var calls atomic.Int64
	held := make(chan struct{})
	target := TargetFunc(func(ctx context.Context, off int64, buf []byte) error {
		calls.Add(1)
		if off < fileBytes {
			close(held)
			<-ctx.Done()
			return ctx.Err()
		}
		<-held // fail only once the other reader is in the middle of its read
		return ReaderTarget(f).Fetch(ctx, off, buf)
	})
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	plan := []Range{{0, 4096}, {fileBytes, 4096}, {8192, 4096}, {16384, 4096}}
	s := e.Join(key(1), target, plan, TaskOptions{Readers: 2})
	<-s.Done()
	if s.State() != Failed || !errors.Is(s.Err(), io.ErrUnexpectedEOF) {
		t.Fatalf("state %v, err %v; want failed with unexpected EOF", s.State(), s.Err())
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d reads; want 2, none after the failure", n)
	}
	if st := e.Stats(); st.TasksFailed != 1 || st.BytesFetched != 0 {
		t.Errorf("tasks failed %d, bytes fetched %d; want 1 and 0", st.TasksFailed, st.BytesFetched)
	}
}

func TestReadPlan(t *testing.T) {
	tests := []struct {
		name string
		plan []Range
		want []Range
	}{
		{"long range split", []Range{{0, 10000}}, []Range{{0, 4096}, {4096, 4096}, {8192, 1808}}},
		{"contiguous coalesced", []Range{{0, 1000}, {1000, 1000}}, []Range{{0, 2000}}},
		{"contiguous past buffer", []Range{{0, 3000}, {3000, 3000}}, []Range{{0, 4096}, {4096, 1904}}},
		{"gap kept", []Range{{0, 1000}, {2000, 1000}}, []Range{{0, 1000}, {2000, 1000}}},
		{"manifest order kept", []Range{{8192, 4096}, {0, 4096}}, []Range{{8192, 4096}, {0, 4096}}},
		{"zero length skipped", []Range{{0, 0}, {4096, 4096}}, []Range{{4096, 4096}}},
		{"empty", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProbe(t, 64*1024)
			e := NewEngine(Options{BufferBytes: testBufferBytes})
			s := e.Join(key(1), p, tt.plan, TaskOptions{})
			<-s.Done()
			if s.State() != Completed {
				t.Fatalf("state %v, err %v", s.State(), s.Err())
			}
			if got := p.spans(); !slices.Equal(got, tt.want) {
				t.Errorf("reads %v; want %v", got, tt.want)
			}
			assertOneBufferPerReader(t, p.recorded(), 1)
		})
	}
}

func TestDefaultBufferIsOneMiB(t *testing.T) {
	p := newProbe(t, 4<<20)
	e := NewEngine(Options{})
	s := e.Join(key(1), p, []Range{{0, 3<<20 + 100}}, TaskOptions{})
	<-s.Done()
	want := []Range{{0, 1 << 20}, {1 << 20, 1 << 20}, {2 << 20, 1 << 20}, {3 << 20, 100}}
	if got := p.spans(); !slices.Equal(got, want) {
		t.Errorf("reads %v; want %v", got, want)
	}
	assertOneBufferPerReader(t, p.recorded(), 1)
}

func assertOneBufferPerReader(t *testing.T, fetches []fetch, readers int) {
	t.Helper()
	bufs := map[*byte]bool{}
	for _, f := range fetches {
		bufs[f.buf] = true
	}
	if len(fetches) > 0 && len(bufs) != readers {
		t.Errorf("%d reads used %d buffers; want %d, one per reader", len(fetches), len(bufs), readers)
	}
}

func TestReadersPerTask(t *testing.T) {
	p := newProbe(t, 1<<20)
	p.gate = newGate()
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	plan := pages(0, 12)
	s := e.Join(key(1), p, plan, TaskOptions{Readers: 3})
	var first []int64
	for range 3 {
		first = append(first, <-p.gate.entered)
	}
	if n := p.inFlight.Load(); n != 3 {
		t.Errorf("%d reads in flight; want the task's 3 readers", n)
	}
	close(p.gate.release)
	<-s.Done()
	if s.State() != Completed {
		t.Fatalf("state %v, err %v", s.State(), s.Err())
	}
	slices.Sort(first)
	if want := []int64{0, 8192, 16384}; !slices.Equal(first, want) {
		t.Errorf("first reads at %v; want the plan's first three %v", first, want)
	}
	got := p.spans()
	slices.SortFunc(got, func(a, b Range) int { return int(a.Offset - b.Offset) })
	if !slices.Equal(got, plan) {
		t.Errorf("reads %v; want each of %v once", got, plan)
	}
	assertOneBufferPerReader(t, p.recorded(), 3)
	if m := e.Stats().MaxReadersInFlight; m != 3 {
		t.Errorf("max readers in flight %d; want 3", m)
	}
}

func TestReadersPerTaskCappedByProcessLimit(t *testing.T) {
	p := newProbe(t, 1<<20)
	p.gate = newGate()
	e := NewEngine(Options{MaxReaders: 2, BufferBytes: testBufferBytes})
	s := e.Join(key(1), p, pages(0, 12), TaskOptions{Readers: 8})
	<-p.gate.entered
	<-p.gate.entered
	close(p.gate.release)
	<-s.Done()
	if m := e.Stats().MaxReadersInFlight; m != 2 || p.maxInFlight.Load() != 2 {
		t.Errorf("max readers in flight %d (probe %d); want 2", m, p.maxInFlight.Load())
	}
	assertOneBufferPerReader(t, p.recorded(), 2)
}

func TestContext(t *testing.T) {
	t.Run("LeaveWait gives up when ctx ends", func(t *testing.T) {
		p := newProbe(t, 1<<20)
		p.gate = newGate()
		e := NewEngine(Options{BufferBytes: testBufferBytes})
		s := e.Join(key(1), p, pages(0, 4), TaskOptions{})
		<-p.gate.entered
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.LeaveWait(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("LeaveWait with a read held: %v; want context.Canceled", err)
		}
		if err := s.Wait(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait with a read held: %v; want context.Canceled", err)
		}
		close(p.gate.release)
		if err := s.LeaveWait(context.Background()); err != nil {
			t.Fatalf("LeaveWait after release: %v", err)
		}
		if s.State() != Cancelled {
			t.Errorf("state %v; want cancelled", s.State())
		}
	})
	t.Run("target honouring cancellation", func(t *testing.T) {
		p := newProbe(t, 1<<20)
		p.gate = newGate()
		p.gate.honourCtx = true
		e := NewEngine(Options{BufferBytes: testBufferBytes})
		s := e.Join(key(1), p, pages(0, 4), TaskOptions{})
		<-p.gate.entered
		<-s.Leave() // the held read returns on cancellation, never released
		if s.State() != Cancelled || !errors.Is(s.Err(), ErrCancelled) {
			t.Errorf("state %v, err %v; want cancelled, not failed", s.State(), s.Err())
		}
		if n := len(p.recorded()); n != 1 {
			t.Errorf("%d reads; want 1", n)
		}
	})
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Queued: "queued", Running: "running", Completed: "completed", Cancelled: "cancelled", Failed: "failed", State(9): "State(9)"} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q; want %q", int(s), got, want)
		}
	}
}

func BenchmarkEngine(b *testing.B) {
	const fileBytes = 16 << 20
	f, _ := memoryFile(b, fileBytes)
	// A startup-like plan: runs of 16 pages spread over the file, in an
	// order that is not the file's.
	rng := rand.New(rand.NewPCG(1, 2))
	var plan []Range
	var total int64
	for _, i := range rng.Perm(fileBytes / (64 * 1024)) {
		plan = append(plan, Range{Offset: int64(i) * 64 * 1024, Length: 16 * 4096})
		total += 16 * 4096
	}
	for _, bc := range []struct {
		name    string
		tasks   int
		readers int
	}{{"seed", 1, 1}, {"readers=4", 1, 4}, {"tasks=8", 8, 1}} {
		b.Run(bc.name, func(b *testing.B) {
			e := NewEngine(Options{})
			target := ReaderTarget(f)
			b.SetBytes(total * int64(bc.tasks))
			gen := uint64(0)
			for b.Loop() {
				subs := make([]*Subscription, bc.tasks)
				for i := range subs {
					gen++
					subs[i] = e.Join(key(gen), target, plan, TaskOptions{Readers: bc.readers})
				}
				for _, s := range subs {
					<-s.Done()
					if s.State() != Completed {
						b.Fatalf("state %v, err %v", s.State(), s.Err())
					}
				}
			}
		})
	}
}

// Each device kind numbers its generations on its own: forgetting a file
// device generation leaves a uffd session of the same number alone, and
// their tasks are never shared.
func TestKeysOfDeviceKindsAreApart(t *testing.T) {
	p := newProbe(t, 1<<20)
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	plan := pages(0, 2)
	file := Key{Device: "file", Generation: 1, Digest: "d"}
	uffd := Key{Device: "uffd", Generation: 1, Digest: "d"}
	<-e.Join(file, p, plan, TaskOptions{}).Done()
	<-e.Join(uffd, p, plan, TaskOptions{}).Done()
	if st := e.Stats(); st.TasksStarted != 2 {
		t.Fatalf("tasks started %d; want 2: a uffd restore joined a file device's task", st.TasksStarted)
	}
	e.Forget("file", 1)
	<-e.Join(uffd, p, plan, TaskOptions{}).Done()
	if st := e.Stats(); st.TasksStarted != 2 {
		t.Fatalf("tasks started %d; want 2: forgetting file generation 1 forgot uffd session 1", st.TasksStarted)
	}
	<-e.Join(file, p, plan, TaskOptions{}).Done()
	if st := e.Stats(); st.TasksStarted != 3 {
		t.Fatalf("tasks started %d; want 3: file generation 1 was not forgotten", st.TasksStarted)
	}
}
