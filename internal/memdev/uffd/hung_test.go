package uffd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/memdev/hungtest"
)

// hungSource is memory whose lower never answers.
type hungSource struct{ l *hungtest.Lower }

func (s hungSource) Ref() string                 { return "hung-1" }
func (s hungSource) Open() (memdev.Lower, error) { return s.l, nil }

// hungLowerFile mounts a FUSE device whose lower never answers and
// returns its device file's path and the lower.
func hungLowerFile(t *testing.T, dir string, size int64) (string, *hungtest.Lower) {
	t.Helper()
	srv, err := fusedev.Mount(filepath.Join(dir, "mnt"), fusedev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lower := hungtest.NewLower(size)
	t.Cleanup(func() { srv.Close() })
	t.Cleanup(lower.Release)
	d, err := srv.Attach("hung", memdev.Request{Memory: hungSource{lower}})
	if err != nil {
		t.Fatal(err)
	}
	return d.Path(), lower
}

// A session whose fault loop is stuck in a read of storage that stopped
// answering still closes within its bound once its VMM is gone, saying
// why, and so does the handler: neither waits for the storage.
func TestCloseIsBoundedWhileTheLowerHangs(t *testing.T) {
	dir, err := os.MkdirTemp("", "uffd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	lowerPath, lower := hungLowerFile(t, dir, lowerBytes)
	h, err := Listen(filepath.Join(dir, "uffd.sock"), openLower(t, lowerPath), Options{})
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan *Session, 1)
	go func() {
		s, _ := h.Accept(context.Background())
		accepted <- s
	}()
	v := startVMM(t, filepath.Join(dir, "uffd.sock"), twoRegions)
	s := await(t, accepted, "accept")
	if s == nil {
		t.Fatal("accept failed")
	}
	// However the test ends, the storage answers and the loop's read
	// returns before the process exits (see the end of the test).
	t.Cleanup(func() {
		lower.Release()
		select {
		case <-s.Done():
		case <-time.After(guardTimeout):
		}
	})
	v.send(childCmd{Op: "touch", Steps: reads(0)})
	await(t, lower.Entered(), "the fault's read of the lower")
	v.kill()
	closeWait = 2 * time.Second
	t.Cleanup(func() { closeWait = defaultCloseWait })
	for _, c := range []struct {
		what    string
		closeIt func() error
		within  time.Duration
	}{
		{"session", s.Close, guardTimeout},
		// The session's bound has passed: the handler does not wait it
		// out again.
		{"handler", h.Close, closeWait / 2},
	} {
		closed := make(chan error, 1)
		go func() { closed <- c.closeIt() }()
		select {
		case err := <-closed:
			if err == nil || !strings.Contains(err.Error(), "still in a read of the memory source") {
				t.Errorf("%s Close = %v, want an error naming the read left behind", c.what, err)
			}
		case <-time.After(c.within):
			t.Fatalf("%s Close still waiting %v after the VMM was killed: it waits for the storage", c.what, c.within)
		}
	}
	// The storage answers at last: the loop left in its read ends. This
	// process serves that read's FUSE file too, so it must not exit with
	// the read still in the kernel: the kernel would wait for an answer
	// from a server that is exiting, and the process could not end.
	lower.Release()
	await(t, s.Done(), "the fault loop's end once the storage answered")
}
