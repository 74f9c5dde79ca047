package fusedev

import (
	"errors"
	"os"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
)

// fileBackedLower is a Lower that is not an *os.File: it reads through a
// file and can be told to fail, and counts its Close calls.
type fileBackedLower struct {
	f      *os.File
	size   int64
	fail   atomic.Bool
	closed *atomic.Int32
}

func (l *fileBackedLower) ReadAt(p []byte, off int64) (int, error) {
	if l.fail.Load() {
		return 0, errors.New("remote store unreachable")
	}
	return l.f.ReadAt(p, off)
}

func (l *fileBackedLower) Size() int64 { return l.size }

func (l *fileBackedLower) Close() error {
	l.closed.Add(1)
	return l.f.Close()
}

func TestAttachLower(t *testing.T) {
	const fileBytes = 8 << 20
	path := writeLower(t, fileBytes, 21)
	srv := newServer(t, Options{})
	var opened, closed atomic.Int32
	var current atomic.Pointer[fileBackedLower]
	open := func() (memdev.Lower, error) {
		opened.Add(1)
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		l := &fileBackedLower{f: f, size: fileBytes, closed: &closed}
		current.Store(l)
		return l, nil
	}
	d, err := srv.Attach("remote", lowerReq("object-1", open, memdev.IOEngineBuffered))
	if err != nil {
		t.Fatal(err)
	}
	// Same key and ref: the generation is shared, nothing is opened again.
	d2, err := srv.Attach("remote", lowerReq("object-1", open, memdev.IOEngineBuffered))
	if err != nil {
		t.Fatal(err)
	}
	if d2.Generation() != d.Generation() || opened.Load() != 1 || d.Size() != fileBytes {
		t.Fatalf("second attach: generation %d vs %d, %d opens, size %d", d2.Generation(), d.Generation(), opened.Load(), d.Size())
	}
	// Another ref, or a local file, under the same key is a conflict.
	if _, err := srv.Attach("remote", lowerReq("object-2", open, memdev.IOEngineBuffered)); !errors.Is(err, ErrAttachConflict) {
		t.Fatalf("attach with another ref: %v", err)
	}
	if _, err := srv.Attach("remote", fileReq(path, memdev.IOEngineBuffered)); !errors.Is(err, ErrAttachConflict) {
		t.Fatalf("attach of a file under a lower's key: %v", err)
	}

	lay := layout.Single(fileBytes)
	pages := randomPages(lay, 500, 3)
	want := lowerHash(t, path, pages, pageBytes)
	if res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: lay, Pages: pages}); res.Err != "" || res.Hash != want {
		t.Fatalf("mapped reads through the lower: hash %s err %q, want %s", res.Hash, res.Err, want)
	}
	// A failing lower is EIO for the reader, never made-up bytes.
	current.Load().fail.Store(true)
	if res := runChildSpec(t, childSpec{Mode: childRead, Path: d.Path(), Pages: []int64{fileBytes - pageBytes}}); res.Errno != int(unix.EIO) {
		t.Fatalf("read through a failing lower: errno %d (%s), want EIO", res.Errno, res.Err)
	}
	waitAck(t, d2.release())
	if closed.Load() != 0 {
		t.Fatal("lower closed while a reference remains")
	}
	waitAck(t, d.release())
	if closed.Load() != 1 {
		t.Fatalf("lower closed %d times after the last release, want 1", closed.Load())
	}

	failing := func() (memdev.Lower, error) { return nil, errors.New("no such object") }
	if _, err := srv.Attach("other", lowerReq("object-3", failing, memdev.IOEngineBuffered)); err == nil {
		t.Fatal("attach whose open fails succeeded")
	}
	if _, err := srv.Attach("bad/key", lowerReq("object-3", open, memdev.IOEngineBuffered)); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("bad key: %v", err)
	}
}
