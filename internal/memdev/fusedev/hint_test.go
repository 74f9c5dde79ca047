package fusedev

import (
	"context"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
)

// countingLower is a local lower file that counts the bytes read from it
// and the ranges advised to it, and passes the advice on to the kernel.
type countingLower struct {
	*os.File
	size int64
	read atomic.Int64

	mu      sync.Mutex
	advised []prefetch.Range
}

func (l *countingLower) ReadAt(p []byte, off int64) (int, error) {
	n, err := l.File.ReadAt(p, off)
	l.read.Add(int64(n))
	return n, err
}

func (l *countingLower) Size() int64 { return l.size }

func (l *countingLower) Advise(off, length int64) error {
	l.mu.Lock()
	l.advised = append(l.advised, prefetch.Range{Offset: off, Length: length})
	l.mu.Unlock()
	return unix.Fadvise(int(l.Fd()), off, length, unix.FADV_WILLNEED)
}

// TestConcurrentRestoresReadAndHintTheLowerOnce: four restores of one
// snapshot on one node attach one device generation and join one
// prefetch task, as a daemon's concurrent restores do. Each asks its
// device for a hinting fill target of the same plan; the task uses the
// first one's, and the others' are dropped when it ends. The lower is
// read once, and advised of the plan at most once, in plan order: a dropped
// target never reaches storage (each extra pass over a plan of thousands of
// ranges costs the node's CPU, and on a cold lower races the pass that
// queues the reads). The used target's hint may be cut short when the task
// ends (its release stops it): by then every range has been read.
func TestConcurrentRestoresReadAndHintTheLowerOnce(t *testing.T) {
	const (
		restores  = 4
		fileBytes = 4 << 20
		runBytes  = 12 << 10
	)
	path := writeLower(t, fileBytes, 41)
	lower := &countingLower{size: fileBytes}
	open := func() (memdev.Lower, error) {
		f, err := os.Open(path)
		lower.File = f
		return lower, err
	}
	var plan []prefetch.Range
	var planBytes int64
	for off := int64(fileBytes) - runBytes; off >= 0; off -= 3 * runBytes {
		plan = append(plan, prefetch.Range{Offset: off, Length: runBytes})
		planBytes += runBytes
	}
	srv := newServer(t, Options{})
	engine := prefetch.NewEngine(prefetch.Options{})
	var (
		subs   []*prefetch.Subscription
		onEnds []func()
		devs   []*Device
	)
	for i := range restores {
		d, err := srv.Attach("snap", lowerReq("counted:"+path, open, memdev.IOEngineBuffered))
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, d)
		target, onEnd, err := d.Target(plan, memdev.TargetOptions{Fill: true, Hint: true})
		if err != nil {
			t.Fatalf("restore %d: target: %v", i, err)
		}
		key := prefetch.Key{Device: "file", Generation: d.ID().Generation, Digest: "plan"}
		sub := engine.Join(key, target, plan, prefetch.TaskOptions{Readers: 2})
		subs, onEnds = append(subs, sub), append(onEnds, onEnd)
	}
	if devs[0].gen != devs[restores-1].gen {
		t.Fatal("the restores did not share the device generation")
	}
	for i, sub := range subs {
		// As a restore does: its target goes when the task ends.
		<-sub.Done()
		onEnds[i]()
		if sub.State() != prefetch.Completed {
			t.Fatalf("restore %d: task %v: %v", i, sub.State(), sub.Err())
		}
	}
	for _, d := range devs {
		waitAck(t, d.release())
	}
	if got := lower.read.Load(); got != planBytes {
		t.Fatalf("%d restores of one generation read %d bytes, want %d", restores, got, planBytes)
	}
	lower.mu.Lock()
	defer lower.mu.Unlock()
	if n := len(lower.advised); n > len(plan) || !slices.Equal(lower.advised, plan[:n]) {
		t.Fatalf("%d restores of one generation advised %d ranges of a %d-range plan, not its prefix once",
			restores, n, len(plan))
	}
}

// gatedLower is a local lower file whose first advice waits, as on a cold
// store, until the channel sent on gate closes; it counts the advices,
// those in progress, and those that began after released was set.
type gatedLower struct {
	*os.File
	size                        int64
	gate                        chan (<-chan struct{})
	entered                     chan struct{}
	calls, inAdvice, afterFinal atomic.Int64
	released                    atomic.Bool
}

func newGatedLower(size int64) *gatedLower {
	return &gatedLower{size: size, gate: make(chan (<-chan struct{}), 1), entered: make(chan struct{})}
}

func (l *gatedLower) Size() int64 { return l.size }

func (l *gatedLower) Advise(off, length int64) error {
	l.inAdvice.Add(1)
	defer l.inAdvice.Add(-1)
	if l.released.Load() {
		l.afterFinal.Add(1)
	}
	if l.calls.Add(1) == 1 {
		close(l.entered)
		<-<-l.gate
	}
	return nil
}

// TestReleaseOfAHintingTargetIsPrompt: a stop releases the target of a
// plan whose storage hint is still running (a cold lower, a plan of
// thousands of ranges). The release returns once the advice in progress
// has: the rest of the plan is not advised, none after the release, and
// the hint of a target released before its first fetch never starts.
func TestReleaseOfAHintingTargetIsPrompt(t *testing.T) {
	const fileBytes = 16 << 20
	path := writeLower(t, fileBytes, 43)
	lower := newGatedLower(fileBytes)
	open := func() (memdev.Lower, error) {
		f, err := os.Open(path)
		lower.File = f
		return lower, err
	}
	var plan []prefetch.Range
	for off := int64(fileBytes) - fillPageBytes; off >= 0; off -= fillPageBytes {
		plan = append(plan, prefetch.Range{Offset: off, Length: fillPageBytes})
	}
	srv := newServer(t, Options{})
	d, err := srv.Attach("snap", lowerReq("gated:"+path, open, memdev.IOEngineBuffered))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, d.release()) }()
	target, release, err := d.Target(plan, memdev.TargetOptions{Fill: true, Hint: true})
	if err != nil {
		t.Fatal(err)
	}
	// The advice in progress ends when the release begins.
	lower.gate <- target.(hintingTarget).hint.Stopping()
	buf := make([]byte, fillPageBytes)
	if err := target.Fetch(context.Background(), plan[0].Offset, buf); err != nil {
		t.Fatal(err)
	}
	<-lower.entered
	released := make(chan struct{})
	go func() {
		release()
		lower.released.Store(true)
		close(released)
	}()
	select {
	case <-released:
	case <-time.After(resultTimeout):
		t.Fatalf("release still waiting after %d advices of a %d-range plan", lower.calls.Load(), len(plan))
	}
	if n, busy := lower.calls.Load(), lower.inAdvice.Load(); n != 1 || busy != 0 {
		t.Fatalf("release during the first advice: %d advices, %d in progress after it; want 1, 0", n, busy)
	}
	// A target released before its first fetch never hints.
	unused, releaseUnused, err := d.Target(plan, memdev.TargetOptions{Fill: true, Hint: true})
	if err != nil {
		t.Fatal(err)
	}
	releaseUnused()
	if err := unused.Fetch(context.Background(), plan[1].Offset, buf); err != nil {
		t.Fatal(err)
	}
	waitAck(t, d.release())
	if n, late := lower.calls.Load(), lower.afterFinal.Load(); n != 1 || late != 0 {
		t.Fatalf("after the releases: %d advices, %d after the first release returned; want 1, 0", n, late)
	}
}
