package fusedev

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
)

// countingLower is a local lower file that counts the bytes read from it
// and the ranges advised to it, and passes the advice on to the kernel.
type countingLower struct {
	*os.File
	size            int64
	read, advisedTo atomic.Int64
	advices         atomic.Int64
}

func (l *countingLower) ReadAt(p []byte, off int64) (int, error) {
	n, err := l.File.ReadAt(p, off)
	l.read.Add(int64(n))
	return n, err
}

func (l *countingLower) Size() int64 { return l.size }

func (l *countingLower) Advise(off, length int64) error {
	l.advices.Add(1)
	l.advisedTo.Add(length)
	return unix.Fadvise(int(l.Fd()), off, length, unix.FADV_WILLNEED)
}

// TestConcurrentRestoresReadAndHintTheLowerOnce: four restores of one
// snapshot on one node attach one device generation and join one
// prefetch task, as a daemon's concurrent restores do. Each asks its
// device for a hinting fill target of the same plan; the task uses the
// first one's, and the others' are dropped when it ends. The lower is
// read once, and advised of the plan once: a dropped target never reaches
// storage (each extra pass over a plan of thousands of ranges costs the
// node's CPU, and on a cold lower races the pass that queues the reads).
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
	got := fmt.Sprintf("read %d bytes, advised %d ranges (%d bytes)", lower.read.Load(), lower.advices.Load(), lower.advisedTo.Load())
	want := fmt.Sprintf("read %d bytes, advised %d ranges (%d bytes)", planBytes, len(plan), planBytes)
	if got != want {
		t.Fatalf("%d restores of one generation: %s, want %s", restores, got, want)
	}
}
