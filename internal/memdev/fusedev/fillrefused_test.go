package fusedev

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"

	"warmstart/internal/layout"
)

// TestRefusedStoreLeavesItsPagesToALaterFill: a fill marks its run served
// before it stores it (so the guest cannot find the pages before they are
// heard of); when the kernel then refuses the store (here it forgot the
// file's inode while the fill was between its read and its store), the
// pages are not cached, and a later fill must bring them rather than skip
// them as served.
func TestRefusedStoreLeavesItsPagesToALaterFill(t *testing.T) {
	const fileBytes, fillBytes = 1 << 20, 64 << 10
	lower := writeLower(t, fileBytes, 17)
	srv := newServer(t, Options{})
	d, obs := attachHeld(t, srv, "refused", lower)
	f, err := os.Open(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	fill := startHeldFill(t, d, obs, 0, fillBytes)
	// The fill has read its run and not yet stored it: close the device
	// file and have the kernel forget its inode, so it refuses the store.
	f.Close()
	forget(t, srv, filepath.Base(d.Path()))
	fill.proceed()
	if err := <-fill.filled; err == nil {
		t.Fatal("a fill whose inode the kernel forgot stored its run")
	}

	f, err = os.Open(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := d.Counters()
	if err := d.Fill(0, make([]byte, fillBytes)); err != nil {
		t.Fatalf("fill after the refused store: %v", err)
	}
	if got := d.Counters().Sub(before); got.BytesRead != fillBytes {
		t.Fatalf("the fill after a refused store read %d bytes of the lower, want %d: it took the run as served", got.BytesRead, fillBytes)
	}
	before = d.Counters()
	pages := []int64{0, fillBytes / 2, fillBytes - pageBytes}
	res := runChildSpec(t, childSpec{Mode: childMmap, Path: d.Path(), Layout: layout.Single(fileBytes), Pages: pages})
	if want := lowerHash(t, lower, pages, pageBytes); res.Err != "" || res.Hash != want {
		t.Fatalf("guest reads: %+v, want hash %s", res, want)
	}
	if got := d.Counters().Sub(before); got.ReadRequests != 0 {
		t.Fatalf("the refilled pages cost %d read requests, want 0: they were not stored", got.ReadRequests)
	}
}

// forget has the kernel forget the inode of srv's file name, which no one
// holds open, and returns once it has (the server heard its FORGET). The
// kernel holds the inode until the server has answered the RELEASE of its
// last open, which comes asynchronously, so the prune is repeated until
// then.
func forget(t *testing.T, srv *Server, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		inode := srv.root.GetChild(name)
		if inode == nil {
			return
		}
		if errno := srv.root.NotifyPrune([]*fs.Inode{inode}); errno != 0 {
			t.Skipf("the kernel cannot be told to forget an inode: %v", errno)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the kernel still holds the inode of %s", name)
		}
		runtime.Gosched()
	}
}
