package prefetch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threadNice is the nice value of the calling goroutine's thread.
func threadNice(tb testing.TB) int {
	// The raw getpriority(2) returns 20 - nice, so that it is never
	// negative.
	p, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	if err != nil {
		tb.Fatalf("getpriority: %v", err)
	}
	return 20 - p
}

// niceTarget records the nice value and the id of the thread each Fetch
// runs on.
type niceTarget struct {
	tb testing.TB
	mu sync.Mutex
	// seen counts fetches by the nice value of their thread.
	seen    map[int]int
	threads map[int]bool
}

func newNiceTarget(tb testing.TB) *niceTarget {
	return &niceTarget{tb: tb, seen: map[int]int{}, threads: map[int]bool{}}
}

func (n *niceTarget) Fetch(_ context.Context, _ int64, _ []byte) error {
	v := threadNice(n.tb)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seen[v]++
	n.threads[unix.Gettid()] = true
	return nil
}

// TestLowPriorityReadersRunAtNice19: a LowPriority task's reads run
// on threads at nice 19, so that the VMM restoring beside them gets the
// CPU first; a task without it reads at the process's priority; and a
// niced thread is never handed back to the process (no later goroutine
// finds itself at nice 19).
func TestLowPriorityReadersRunAtNice19(t *testing.T) {
	base := threadNice(t)
	if base == LowPriorityNice {
		t.Skipf("the test process already runs at nice %d", base)
	}
	for _, low := range []bool{true, false} {
		target := newNiceTarget(t)
		e := NewEngine(Options{BufferBytes: testBufferBytes})
		s := e.Join(key(1), target, pages(0, 32), TaskOptions{Readers: 2, LowPriority: low})
		<-s.Done()
		if s.State() != Completed {
			t.Fatalf("low priority %v: state %v, err %v", low, s.State(), s.Err())
		}
		want := base
		if low {
			want = LowPriorityNice
		}
		if target.seen[want] != 32 || len(target.seen) != 1 {
			t.Fatalf("low priority %v: fetches by thread nice %v, want all 32 at %d", low, target.seen, want)
		}
	}
	// Many goroutines, each on a thread of its own at once: none may get
	// a thread a low-priority reader niced.
	var wg sync.WaitGroup
	var mu sync.Mutex
	niced := 0
	for range 64 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if threadNice(t) != base {
				mu.Lock()
				niced++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if niced != 0 {
		t.Fatalf("%d of 64 goroutines ran on a thread left at another priority", niced)
	}
}

// TestLowPriorityThreadsLiveOn: the threads low-priority reads run on are
// kept for the next task, never ended. A thread that ends takes with it
// every child process it started with a parent-death signal (Go starts a
// child from whichever thread its goroutine ran on, and the VMM drivers
// ask for SIGKILL on the parent's death): a reader locking such a thread
// and ending it killed a running QEMU. Three tasks of two readers, one
// after the other, read on two threads in all.
func TestLowPriorityThreadsLiveOn(t *testing.T) {
	target := newNiceTarget(t)
	e := NewEngine(Options{BufferBytes: testBufferBytes, MaxReaders: 2})
	for i := range 3 {
		s := e.Join(key(uint64(i+1)), target, pages(0, 16), TaskOptions{Readers: 2, LowPriority: true})
		<-s.Done()
		if s.State() != Completed {
			t.Fatalf("task %d: state %v, err %v", i, s.State(), s.Err())
		}
	}
	if len(target.threads) > 2 {
		t.Fatalf("three tasks of two readers read on %d threads, want at most 2 (the threads are kept)", len(target.threads))
	}
	for tid := range target.threads {
		if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); err != nil {
			t.Errorf("thread %d of a low-priority reader ended: %v", tid, err)
		}
	}
}

// heldNiceTarget is a niceTarget whose first Fetch waits at a gate.
type heldNiceTarget struct {
	*niceTarget
	first   sync.Once
	entered chan struct{}
	release chan struct{}
}

func (h *heldNiceTarget) Fetch(ctx context.Context, off int64, buf []byte) error {
	err := h.niceTarget.Fetch(ctx, off, buf)
	h.first.Do(func() {
		close(h.entered)
		<-h.release
	})
	return err
}

// TestLowPriorityEndsWhenTheGuestOvertakes: once the guest faults ahead of
// a low-priority task (following moves its cursor), the guest waits for
// the task's reads, so the rest of them run at the process's priority.
func TestLowPriorityEndsWhenTheGuestOvertakes(t *testing.T) {
	base := threadNice(t)
	if base == LowPriorityNice {
		t.Skipf("the test process already runs at nice %d", base)
	}
	target := &heldNiceTarget{niceTarget: newNiceTarget(t), entered: make(chan struct{}), release: make(chan struct{})}
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	plan := pages(0, 32)
	s := e.Join(key(1), target, plan, TaskOptions{Readers: 1, Follow: true, LowPriority: true})
	<-target.entered // the first read, at nice 19
	s.Follow(plan[20].Offset, testBufferBytes)
	close(target.release)
	<-s.Done()
	if s.State() != Completed {
		t.Fatalf("state %v, err %v", s.State(), s.Err())
	}
	if e.Stats().Jumps != 1 {
		t.Fatalf("jumps %d, want 1", e.Stats().Jumps)
	}
	if target.seen[LowPriorityNice] != 1 || target.seen[base] != 31 {
		t.Fatalf("fetches by thread nice %v, want 1 at %d (before the guest overtook) and 31 at %d", target.seen, LowPriorityNice, base)
	}
}

// TestLowPriorityHandsBackWhenTheGuestReachesItsFront: a guest that
// faults on the very read the task would claim next has caught up with
// it, and waits for it as much as one that faulted further ahead: the
// readers go on at the process's priority, though the cursor did not move.
func TestLowPriorityHandsBackWhenTheGuestReachesItsFront(t *testing.T) {
	base := threadNice(t)
	if base == LowPriorityNice {
		t.Skipf("the test process already runs at nice %d", base)
	}
	target := &heldNiceTarget{niceTarget: newNiceTarget(t), entered: make(chan struct{}), release: make(chan struct{})}
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	plan := pages(0, 32)
	s := e.Join(key(1), target, plan, TaskOptions{Readers: 1, Follow: true, LowPriority: true})
	<-target.entered // plan[0] claimed and being read, at nice 19
	s.Follow(plan[1].Offset, testBufferBytes)
	close(target.release)
	<-s.Done()
	if s.State() != Completed {
		t.Fatalf("state %v, err %v", s.State(), s.Err())
	}
	if target.seen[LowPriorityNice] != 1 || target.seen[base] != 31 {
		t.Fatalf("fetches by thread nice %v, want 1 at %d (before the guest caught up) and 31 at %d", target.seen, LowPriorityNice, base)
	}
}

// countingHeldTarget holds its first Fetch until release and reports on
// rest once the other reads are all done.
type countingHeldTarget struct {
	*heldNiceTarget
	others atomic.Int64
	want   int64
	rest   chan struct{}
}

func (c *countingHeldTarget) Fetch(ctx context.Context, off int64, buf []byte) error {
	if off == 0 {
		return c.heldNiceTarget.Fetch(ctx, off, buf)
	}
	err := c.niceTarget.Fetch(ctx, off, buf)
	if c.others.Add(1) == c.want {
		close(c.rest)
	}
	return err
}

// TestLowPriorityHandBackDoesNotWaitForTheThread: on a host whose CPUs are
// busy, a thread at nice 19 may not run for a long time; once the guest
// has overtaken the task, the reads it waits for must not wait for that
// thread to notice. Here the low-priority thread is stuck in its first
// read (as it is when it gets no CPU): the rest of the plan is read at the
// process's priority all the same.
func TestLowPriorityHandBackDoesNotWaitForTheThread(t *testing.T) {
	base := threadNice(t)
	if base == LowPriorityNice {
		t.Skipf("the test process already runs at nice %d", base)
	}
	held := &heldNiceTarget{niceTarget: newNiceTarget(t), entered: make(chan struct{}), release: make(chan struct{})}
	target := &countingHeldTarget{heldNiceTarget: held, want: 31, rest: make(chan struct{})}
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	plan := pages(0, 32)
	s := e.Join(key(1), target, plan, TaskOptions{Readers: 1, Follow: true, LowPriority: true})
	<-held.entered
	s.Follow(plan[20].Offset, testBufferBytes)
	select {
	case <-target.rest:
	case <-time.After(10 * time.Second):
		close(held.release)
		<-s.Done()
		t.Fatalf("the rest of the plan waited for the stuck low-priority thread (fetches by nice %v)", held.seen)
	}
	close(held.release)
	<-s.Done()
	if s.State() != Completed {
		t.Fatalf("state %v, err %v", s.State(), s.Err())
	}
	if held.seen[LowPriorityNice] != 1 || held.seen[base] != 31 {
		t.Fatalf("fetches by thread nice %v, want 1 at %d and 31 at %d", held.seen, LowPriorityNice, base)
	}
}

// nicedThreads counts the process's threads at LowPriorityNice.
func nicedThreads(t *testing.T) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, task := range tasks {
		stat, err := os.ReadFile("/proc/self/task/" + task.Name() + "/stat")
		if err != nil {
			continue // the thread ended meanwhile
		}
		// Fields after the command's closing parenthesis: state is
		// field 3, nice field 19.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 16 && fields[16] == strconv.Itoa(LowPriorityNice) {
			n++
		}
	}
	return n
}

// gatedTarget holds its first held fetches until open is closed.
type gatedTarget struct {
	held    atomic.Int64
	entered chan struct{} // closed when held fetches are waiting
	want    int64
	open    chan struct{}
}

func (g *gatedTarget) Fetch(context.Context, int64, []byte) error {
	if n := g.held.Add(1); n <= g.want {
		if n == g.want {
			close(g.entered)
		}
		<-g.open
	}
	return nil
}

// TestLowPriorityThreadsBoundedByReadSlots: threads at nice 19 are never
// given back, so their number must be bounded by the engine's reads in
// flight (MaxReaders), not grow with the restores a daemon runs at once:
// sixteen tasks of two readers sharing two read slots niced at most two
// more threads than there were.
func TestLowPriorityThreadsBoundedByReadSlots(t *testing.T) {
	const slots = 2
	before := nicedThreads(t)
	target := &gatedTarget{entered: make(chan struct{}), want: slots, open: make(chan struct{})}
	e := NewEngine(Options{BufferBytes: testBufferBytes, MaxReaders: slots})
	var subs []*Subscription
	for i := range 16 {
		subs = append(subs, e.Join(key(uint64(i+1)), target, pages(0, 8), TaskOptions{Readers: 2, Follow: true, LowPriority: true}))
	}
	<-target.entered
	during := nicedThreads(t)
	close(target.open)
	for i, s := range subs {
		<-s.Done()
		if s.State() != Completed {
			t.Fatalf("task %d: state %v, err %v", i, s.State(), s.Err())
		}
	}
	if after := nicedThreads(t); max(during, after) > max(before, slots) {
		t.Fatalf("niced threads: %d before, %d during, %d after 16 tasks of 2 readers on %d slots; want at most %d",
			before, during, after, slots, max(before, slots))
	}
}

// pinnedSpinner keeps one CPU busy at the process's priority, from a
// thread of its own pinned there, until stop.
func pinnedSpinner(t *testing.T, cpu int) (stop func()) {
	var done atomic.Bool
	ended := make(chan struct{})
	ready := make(chan error, 1)
	go func() {
		defer close(ended)
		runtime.LockOSThread() // ends with the goroutine: its affinity goes with it
		var set unix.CPUSet
		set.Set(cpu)
		ready <- unix.SchedSetaffinity(0, &set)
		for !done.Load() {
		}
	}()
	if err := <-ready; err != nil {
		t.Fatalf("pin the spinner: %v", err)
	}
	return func() { done.Store(true); <-ended }
}

// starvingTarget's first Fetch runs on the CPU the spinner keeps busy
// until it has had a millisecond of it, so its thread waits for the CPU
// far longer than it runs, as on a host whose CPUs other work keeps busy.
type starvingTarget struct {
	*niceTarget
	cpu   int
	first sync.Once
	err   error
}

func (s *starvingTarget) Fetch(ctx context.Context, off int64, buf []byte) error {
	err := s.niceTarget.Fetch(ctx, off, buf)
	s.first.Do(func() {
		var all, one unix.CPUSet
		if s.err = unix.SchedGetaffinity(0, &all); s.err != nil {
			return
		}
		one.Set(s.cpu)
		if s.err = unix.SchedSetaffinity(0, &one); s.err != nil {
			return
		}
		defer func() { s.err = unix.SchedSetaffinity(0, &all) }()
		ran, _ := threadCPU()
		for now := ran; now-ran < time.Millisecond; now, _ = threadCPU() {
		}
	})
	return err
}

// TestLowPriorityHandsBackWhenItFindsNoIdleCPU: nice 19 is meant to use
// CPU the VMM leaves idle. A low-priority read whose thread waited for a
// CPU longer than it ran found none: the rest of the plan is read at the
// process's priority, as if the guest had overtaken the task.
func TestLowPriorityHandsBackWhenItFindsNoIdleCPU(t *testing.T) {
	base := threadNice(t)
	if base == LowPriorityNice {
		t.Skipf("the test process already runs at nice %d", base)
	}
	if _, waited := threadCPU(); waited == 0 {
		t.Skip("the kernel does not report how long a thread waited for a CPU")
	}
	const cpu = 0
	stop := pinnedSpinner(t, cpu)
	target := &starvingTarget{niceTarget: newNiceTarget(t), cpu: cpu}
	e := NewEngine(Options{BufferBytes: testBufferBytes})
	s := e.Join(key(1), target, pages(0, 32), TaskOptions{Readers: 1, Follow: true, LowPriority: true})
	<-s.Done()
	stop()
	if target.err != nil {
		t.Fatal(target.err)
	}
	if s.State() != Completed {
		t.Fatalf("state %v, err %v", s.State(), s.Err())
	}
	if target.seen[LowPriorityNice] != 1 || target.seen[base] != 31 {
		t.Fatalf("fetches by thread nice %v, want 1 at %d (the starved read) and 31 at %d", target.seen, LowPriorityNice, base)
	}
}

// ctxHeldTarget's first Fetch waits until its context ends.
type ctxHeldTarget struct {
	first   sync.Once
	entered chan struct{}
}

func (c *ctxHeldTarget) Fetch(ctx context.Context, _ int64, _ []byte) error {
	held := false
	c.first.Do(func() { held = true; close(c.entered) })
	if held {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// TestLowPriorityLeaveWhileAReadWaits: the last consumer leaving while a
// low-priority read is in progress (and after the guest overtook the task,
// with a reader at the process's priority beside it) cancels it; Leave's
// channel closes once that read returned, and no goroutine is left over.
func TestLowPriorityLeaveWhileAReadWaits(t *testing.T) {
	for _, overtake := range []bool{false, true} {
		before := runtime.NumGoroutine()
		target := &ctxHeldTarget{entered: make(chan struct{})}
		e := NewEngine(Options{BufferBytes: testBufferBytes})
		plan := pages(0, 64)
		s := e.Join(key(1), target, plan, TaskOptions{Readers: 2, Follow: true, LowPriority: true})
		<-target.entered
		if overtake {
			s.Follow(plan[40].Offset, testBufferBytes)
		}
		select {
		case <-s.Leave():
		case <-time.After(10 * time.Second):
			t.Fatalf("overtaken %v: leave did not end the low-priority read", overtake)
		}
		<-s.Done()
		if s.State() != Cancelled && s.State() != Completed {
			t.Fatalf("overtaken %v: state %v, err %v", overtake, s.State(), s.Err())
		}
		// The readers' goroutines are gone once the task is done; the
		// worker goroutines of the kept threads are not counted anew
		// (at most MaxReaders of them, now idle).
		if after := runtime.NumGoroutine(); after > before+DefaultMaxReaders {
			t.Fatalf("overtaken %v: %d goroutines after the task, %d before", overtake, after, before)
		}
	}
}
