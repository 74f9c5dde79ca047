// Package prefetch is the shared in-flight prefetch engine: it brings the
// logical memory ranges of a startup manifest into a memory device, ahead of
// the VMM faulting them, concurrently with the VM restore. It knows nothing
// of any particular device; a Target does the device's part (a buffered
// pread through the device file the VMM maps, or a bulk install into a VM).
//
// How it maps to the seed's startup prefetch:
//
//   - Sharing: a task is keyed by (device generation, manifest digest).
//     Concurrent Joins of one key share one task. A Join of a key whose task
//     completed gets that outcome without reading again, because the
//     generation's cache is already warm. A Join of a key whose task was
//     cancelled or failed, or whose every consumer has left, starts a new
//     task. Ended tasks are retained until Forget(generation), which the
//     owner calls once it has released that device generation.
//     On a userfaultfd device the cache is one VM's memory, so sharing is
//     per VM: there the Generation must name that VM's device instance.
//   - Reads: each task has one reader (TaskOptions.Readers) and one buffer of
//     1 MiB (TaskOptions.BufferBytes) per reader, allocated once for the
//     reader's life. Ranges are read in manifest order; a range longer than
//     the buffer is split into buffer-sized reads, and ranges that are
//     exactly contiguous are coalesced into one read up to the buffer size.
//     Nothing else is reordered or merged, so the reads follow the order in
//     which the guest first touched memory.
//   - At most four readers read at once in the process (Options.MaxReaders),
//     across all tasks. The limit is taken per read, not per task, so many
//     tasks interleave (waiters are served first come, first served) instead
//     of one large task holding a slot until it ends.
//   - States: a task ends Completed, Cancelled or Failed. The end is
//     announced by a channel closed exactly once (Subscription.Done), and the
//     state and error are retained, so a consumer that asks later, or joins
//     later, still learns the outcome.
//   - Consumers leaving: when one consumer leaves, the task goes on for the
//     others. When the last one leaves, reads not yet started are cancelled,
//     including one waiting for a reader slot. A read already in progress may
//     be blocked in the kernel and cannot be interrupted, so it is waited
//     for: the channel returned by the last Leave closes only once the
//     task's reads have all returned. The restore path stops the VM first,
//     then waits on that channel, then releases the device.
//   - Failure: a Target error fails the task with that error, wrapped with
//     the range it was reading. Restoring goes on with on-demand faults; that
//     decision belongs to the caller.
//
// With more than one reader per task (a policy for benchmarking, not the
// seed's), readers take the next read from a shared cursor, so reads still
// start in manifest order.
//
// Following the guest (TaskOptions.Follow, not the seed's): the consumer
// tells the task of every demand request its guest makes
// (Subscription.Follow). When the guest asks for memory of a read the task
// has not claimed yet, ahead of the cursor, the cursor moves to that read:
// it is claimed next (its other pages are still needed soon), then the
// ones after it. The reads jumped over are work the guest has already
// passed; they are read after the end of the plan, in plan order, unless
// the task ends first. A request behind the cursor, for memory already
// read, or outside the plan changes nothing. A shared task follows
// whichever of its guests faults ahead of it (see Subscription.Follow).
package prefetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// Defaults are the seed's figures.
const (
	// DefaultMaxReaders is how many prefetch reads a process has in
	// flight at once unless told otherwise: the seed's four. It is a
	// default, not a cap: [prefetch] max_readers may raise it for storage
	// that rewards more parallel reads, and the benchmark raises a trial's
	// engine to what its policy was designed for (restore.Policy.MaxReaders:
	// eight for e2b), so each policy is measured as its authors run it
	// rather than throttled by the seed's figure.
	DefaultMaxReaders     = 4
	DefaultReadersPerTask = 1
	DefaultBufferBytes    = 1 << 20
)

var (
	// ErrCancelled is a cancelled task's error: every consumer left before
	// its reads were done.
	ErrCancelled = errors.New("prefetch cancelled: every consumer left")
	// ErrInvalidRange fails a task whose plan holds a range with a negative
	// offset or length, or one that overflows.
	ErrInvalidRange = errors.New("invalid prefetch range")
	// ErrNoTarget fails a task joined without a Target.
	ErrNoTarget = errors.New("prefetch task has no target")
)

// Target is what a task reads or installs through.
type Target interface {
	// Fetch brings logical memory [off, off+len(buf)) into the device's
	// cache: on a file device, a pread of the device file into buf; on a
	// userfaultfd device, an install of those bytes into the VM, with buf as
	// staging. It returns nil only when the whole range was brought in.
	// ctx is cancelled once every consumer has left; a Fetch that cannot be
	// interrupted may ignore it, and the engine waits for it to return.
	Fetch(ctx context.Context, off int64, buf []byte) error
}

// TargetFunc adapts a function to a Target.
type TargetFunc func(ctx context.Context, off int64, buf []byte) error

// Fetch calls f.
func (f TargetFunc) Fetch(ctx context.Context, off int64, buf []byte) error { return f(ctx, off, buf) }

// ReaderTarget returns a Target that reads through r, such as the device
// file a VMM maps: the read itself is what warms the device's cache. A short
// read fails with io.ErrUnexpectedEOF.
func ReaderTarget(r io.ReaderAt) Target { return readerTarget{r} }

type readerTarget struct{ r io.ReaderAt }

func (t readerTarget) Fetch(_ context.Context, off int64, buf []byte) error {
	n, err := t.r.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// Key identifies a shareable prefetch: the same manifest on the same device
// generation warms the same cache.
type Key struct {
	// Device is the kind of memory device the reads go through ("file",
	// "uffd"): each kind numbers its generations on its own, and a task
	// of one kind is never joined by a restore on another.
	Device string
	// Generation is the memory device generation the reads go through.
	Generation uint64
	// Digest is the manifest's SHA-256, as recorded in its descriptor.
	Digest string
}

func (k Key) String() string {
	return fmt.Sprintf("%s device generation %d manifest %s", k.Device, k.Generation, k.Digest)
}

// Range is a run of logical memory: bytes [Offset, Offset+Length) of the
// memory file.
type Range struct {
	Offset int64
	Length int64
}

// Options configure an Engine. Zero or negative fields take the defaults.
type Options struct {
	// MaxReaders bounds the reads in progress at once across all tasks.
	MaxReaders int
	// ReadersPerTask is the reader count of a task whose TaskOptions leave
	// it unset.
	ReadersPerTask int
	// BufferBytes is the per-reader buffer size of a task whose TaskOptions
	// leave it unset.
	BufferBytes int
}

// TaskOptions choose the policy of one task. They take effect only for the
// Join that starts the task; joiners of a running task share its policy.
// Zero or negative fields take the engine's values. Readers is capped by
// the engine's MaxReaders and by the number of reads in the plan.
type TaskOptions struct {
	Readers     int
	BufferBytes int
	// Follow moves the task's cursor to where its guests fault (see the
	// package doc); without it Subscription.Follow does nothing.
	Follow bool
}

// State is where a task is in its life.
type State int

const (
	// Queued: no read has started yet.
	Queued State = iota
	// Running: at least one read has started.
	Running
	// Completed: every range was brought in.
	Completed
	// Cancelled: every consumer left before the reads were done.
	Cancelled
	// Failed: a read failed; Err says which and why.
	Failed
)

// Ended reports whether s is a final state.
func (s State) Ended() bool { return s >= Completed }

func (s State) String() string {
	switch s {
	case Queued:
		return "queued"
	case Running:
		return "running"
	case Completed:
		return "completed"
	case Cancelled:
		return "cancelled"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Stats are the engine's counters since it was made.
type Stats struct {
	TasksStarted   uint64
	TasksCompleted uint64
	TasksCancelled uint64
	TasksFailed    uint64
	// Fetches counts Target.Fetch calls that returned, successful or not.
	Fetches uint64
	// BytesFetched counts bytes of successful fetches.
	BytesFetched uint64
	// ReadersInFlight is the number of Fetch calls in progress now.
	ReadersInFlight int64
	// MaxReadersInFlight is the highest ReadersInFlight has been.
	MaxReadersInFlight int64
	// Jumps counts Follow calls that moved a task's cursor.
	Jumps uint64
	// DeferredReads counts reads started by the pass after the end of a
	// plan: the reads a cursor jumped over (and, seldom, one a reader had
	// drawn from the cursor but not yet claimed when that pass took it).
	DeferredReads uint64
}

// Engine runs prefetch tasks and shares them by Key. Use one per process:
// the reader limit holds within an Engine.
type Engine struct {
	maxReaders     int
	readersPerTask int
	bufferBytes    int
	// slots is the process-wide reader semaphore. Blocked channel senders
	// are woken in arrival order, which keeps interleaving tasks fair.
	slots chan struct{}

	mu    sync.Mutex // guards tasks and every task's consumers and state
	tasks map[Key]*task

	tasksStarted, tasksCompleted, tasksCancelled, tasksFailed atomic.Uint64
	fetches, bytesFetched                                     atomic.Uint64
	readersInFlight, maxReadersInFlight                       atomic.Int64
	jumps, deferredReads                                      atomic.Uint64
}

// NewEngine returns an Engine with opts, defaults filled in.
func NewEngine(opts Options) *Engine {
	e := &Engine{
		maxReaders:     positiveOr(opts.MaxReaders, DefaultMaxReaders),
		readersPerTask: positiveOr(opts.ReadersPerTask, DefaultReadersPerTask),
		bufferBytes:    positiveOr(opts.BufferBytes, DefaultBufferBytes),
		tasks:          make(map[Key]*task),
	}
	e.slots = make(chan struct{}, e.maxReaders)
	return e
}

func positiveOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// Join subscribes to the prefetch of key, starting a task that fetches
// ranges through target unless one can be shared (see the package doc).
// target, ranges and opts are used only when a task starts. Join never
// blocks on I/O. An invalid plan yields a task that fails at once, so
// callers have one place to learn of every failure: the Subscription.
func (e *Engine) Join(key Key, target Target, ranges []Range, opts TaskOptions) *Subscription {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t, ok := e.tasks[key]; ok && t.shareableLocked() {
		t.consumers++
		return &Subscription{t: t}
	}
	t := e.newTask(key, target, ranges, opts)
	t.consumers = 1
	e.tasks[key] = t
	e.tasksStarted.Add(1)
	go t.run()
	return &Subscription{t: t}
}

// Forget drops the tasks of a device generation, so later Joins of their
// keys start afresh. Call it once the generation's device is released:
// then no read of it can be in progress, and no new one can be wanted.
// Subscriptions already handed out keep working.
func (e *Engine) Forget(device string, generation uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.tasks {
		if k.Device == device && k.Generation == generation {
			delete(e.tasks, k)
		}
	}
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	return Stats{
		TasksStarted:       e.tasksStarted.Load(),
		TasksCompleted:     e.tasksCompleted.Load(),
		TasksCancelled:     e.tasksCancelled.Load(),
		TasksFailed:        e.tasksFailed.Load(),
		Fetches:            e.fetches.Load(),
		BytesFetched:       e.bytesFetched.Load(),
		ReadersInFlight:    e.readersInFlight.Load(),
		MaxReadersInFlight: e.maxReadersInFlight.Load(),
		Jumps:              e.jumps.Load(),
		DeferredReads:      e.deferredReads.Load(),
	}
}

func (e *Engine) readerStarted() {
	n := e.readersInFlight.Add(1)
	for {
		m := e.maxReadersInFlight.Load()
		if n <= m || e.maxReadersInFlight.CompareAndSwap(m, n) {
			return
		}
	}
}

func (e *Engine) readerReturned(n int, err error) {
	e.readersInFlight.Add(-1)
	e.fetches.Add(1)
	if err == nil {
		e.bytesFetched.Add(uint64(n))
	}
}

// Subscription is one consumer's hold on a task. Its methods are safe for
// concurrent use and keep answering after the task ends or the consumer
// leaves.
type Subscription struct {
	t *task
	// left and leftCh are guarded by the engine's mutex.
	left   bool
	leftCh <-chan struct{}
}

// Key is the key the task was joined by.
func (s *Subscription) Key() Key { return s.t.key }

// Done returns a channel closed when the task has ended and none of its
// reads is in progress. It is the same channel for every consumer, closed
// once; after the end it is already closed.
func (s *Subscription) Done() <-chan struct{} { return s.t.done }

// State returns the task's state now.
func (s *Subscription) State() State {
	s.t.e.mu.Lock()
	defer s.t.e.mu.Unlock()
	return s.t.state
}

// Err returns nil unless the task ended Cancelled (ErrCancelled) or Failed
// (the wrapped read error).
func (s *Subscription) Err() error {
	s.t.e.mu.Lock()
	defer s.t.e.mu.Unlock()
	return s.t.err
}

// PlanBytes is how many bytes the task's plan reads: the plan of the
// Join that started it, which a later Join of the same key shares
// whatever plan it brought.
func (s *Subscription) PlanBytes() int64 { return s.t.planBytes }

// BytesFetched is how many bytes the task has brought in so far.
func (s *Subscription) BytesFetched() int64 { return s.t.bytesFetched.Load() }

// Follow tells the task that a guest asked its device for logical memory
// [off, off+n) on demand: a page fault, or on a file device the fault and
// the kernel's readaround around it. A task that follows the guest moves
// its cursor to the earliest-ranked unclaimed read, ahead of the cursor,
// overlapping that memory (the package doc says what then happens). It
// does nothing for a task that does not follow, or that has ended. It
// never blocks and does no I/O, so a device may call it while serving the
// fault.
//
// Every consumer of a shared task may call it, and the task follows
// whichever guest faults ahead of its cursor. That is right because a task
// is shared only where its device's cache is: a file device generation's
// page cache, which every VM on it maps. A page one guest faulted is then
// in every guest's reach, so a guest behind the leader finds what the
// leader passed already in memory, and the reads worth doing are the ones
// ahead of the guest furthest on. (On a uffd device a task serves one VM.)
func (s *Subscription) Follow(off int64, n int) { s.t.follow(off, n) }

// Wait blocks until the task ends or ctx is done, and returns ctx's error
// in the latter case. The outcome is in State and Err.
func (s *Subscription) Wait(ctx context.Context) error {
	select {
	case <-s.t.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Leave ends this consumer's interest and returns at once. Calling it again
// returns the same channel. The returned channel closes once this consumer
// no longer keeps any read alive: at once if other consumers remain or the
// task has ended; otherwise (the last consumer) the task's unstarted reads
// are cancelled and the channel closes when its in-progress reads have
// returned. Keep the device's reference until then.
func (s *Subscription) Leave() <-chan struct{} {
	e := s.t.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.left {
		return s.leftCh
	}
	s.left = true
	s.t.consumers--
	if s.t.consumers == 0 && !s.t.state.Ended() {
		s.t.cancel(ErrCancelled)
		s.leftCh = s.t.done
	} else {
		s.leftCh = closedChan
	}
	return s.leftCh
}

// LeaveWait leaves and waits until the channel Leave returns closes, or ctx
// is done, in which case it returns ctx's error and reads may still be in
// progress.
func (s *Subscription) LeaveWait(ctx context.Context) error {
	ch := s.Leave()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for prefetch reads of %s: %w", s.t.key, ctx.Err())
	}
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()
