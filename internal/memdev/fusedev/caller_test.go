package fusedev

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev"
)

// lookups counts the /proc lookups a callers value makes.
type lookups struct {
	own   map[uint32]bool
	calls map[uint32]int
}

func (l *lookups) isOwn(tid uint32) bool {
	l.calls[tid]++
	return l.own[tid]
}

// A guest faulting page by page sends thousands of requests from one
// thread: its classification is looked up once, not once a request, and
// looked up again only after foreignTTL, when its id could have been
// reused.
func TestCallerClassificationIsRemembered(t *testing.T) {
	l := &lookups{own: map[uint32]bool{7: true}, calls: map[uint32]int{}}
	now := time.Unix(1000, 0)
	c := newCallers(l.isOwn, func() time.Time { return now })

	for range 1000 {
		if k := c.kind(42); k != memdev.Demand {
			t.Fatalf("foreign thread classified %v", k)
		}
		if k := c.kind(7); k != memdev.Prefetch {
			t.Fatalf("own thread classified %v", k)
		}
	}
	if l.calls[42] != 1 || l.calls[7] != 1 {
		t.Fatalf("lookups: foreign %d, own %d; want 1 each", l.calls[42], l.calls[7])
	}

	now = now.Add(foreignTTL)
	c.kind(42)
	c.kind(7)
	if l.calls[42] != 2 || l.calls[7] != 1 {
		t.Fatalf("after %v: lookups foreign %d (want 2: looked up again), own %d (want 1)", foreignTTL, l.calls[42], l.calls[7])
	}
}

// A daemon serves VMMs for months: the remembered foreign threads stay
// bounded however many come and go.
func TestRememberedForeignCallersAreBounded(t *testing.T) {
	l := &lookups{own: map[uint32]bool{}, calls: map[uint32]int{}}
	now := time.Unix(1000, 0)
	c := newCallers(l.isOwn, func() time.Time { return now })
	for tid := range uint32(3 * maxForeign) {
		c.kind(tid + 100)
		if tid%1000 == 0 {
			now = now.Add(foreignTTL / 2)
		}
	}
	if n := len(c.foreign); n > maxForeign {
		t.Fatalf("%d foreign callers remembered, want at most %d", n, maxForeign)
	}
}

// The real lookup: this process's thread is ours, pid 1's is not.
func TestOwnThreadLookup(t *testing.T) {
	if !isOwnThread(uint32(unix.Gettid())) {
		t.Fatal("this thread not recognised as this process's")
	}
	if os.Getpid() != 1 && isOwnThread(1) {
		t.Fatal("pid 1 recognised as this process's thread")
	}
}
