package fusedev

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
)

// fullRunDir mounts a tmpfs of size bytes over a new temporary directory
// and fills all of it but room bytes with the returned file; removing
// that file frees the space.
func fullRunDir(t *testing.T, size, room int64) (dir, filler string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir = t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	filler = filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, size-room), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, filler
}

// TestWritableViewOverlayFullLosesNoWrite: the view's overlay lives in the
// restore's run directory; when that file system is full, the kernel's
// write-back of some written pages cannot be stored there. Those pages are
// the guest's: a read after the page cache dropped them still serves the
// written bytes (never the published ones: the guest's memory would
// revert), a freeze while the disk is full fails with ENOSPC rather than
// publish a diff without them, and once there is room a freeze copies
// every written page.
func TestWritableViewOverlayFullLosesNoWrite(t *testing.T) {
	const fileBytes = 4 << 20
	lower := writeLower(t, fileBytes, 23)
	lay := layout.Single(fileBytes)
	// Eight pages far apart, each its own write-back; the tmpfs has room
	// for four.
	var pages []int64
	for i := range int64(8) {
		pages = append(pages, i*100*pageBytes)
	}
	run, filler := fullRunDir(t, 64<<10, 4*pageBytes)
	srv := newServer(t, Options{AllowWriteOpen: true})
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Writable, req.RunDir = true, run
	view, err := srv.Attach("snap", req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, view.release()) }()

	writer := childSpec{Mode: childMmap, Path: view.Path(), Layout: lay, Pages: pages, Shared: true, ReadWrite: true, Write: true}
	if res := runChildSpec(t, writer); res.Err != "" {
		t.Fatalf("writer: %s", res.Err)
	}
	if err := view.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if got, err := view.FreezeWritten(filepath.Join(t.TempDir(), "memory.diff")); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("FreezeWritten with the overlay's file system full = pages %v, %v; want ENOSPC", got, err)
	}
	dropCache(t, view.Path())
	for _, off := range pages {
		res := runChildSpec(t, childSpec{Mode: childRead, Path: view.Path(), Pages: []int64{off}})
		if want := writtenBytes(t, lower, []int64{off}); res.Err != "" || res.Hash != want {
			t.Errorf("page at %d read after eviction: hash %s err %q, want the written bytes", off, res.Hash, res.Err)
		}
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	diff := filepath.Join(t.TempDir(), "memory.diff")
	got, err := view.FreezeWritten(diff)
	if err != nil {
		t.Fatalf("FreezeWritten with room again: %v", err)
	}
	if len(got) != len(pages) {
		t.Errorf("FreezeWritten = pages %v, want the %d written", got, len(pages))
	}
	if h := hashAt(t, diff, pages); h != writtenBytes(t, lower, pages) {
		t.Error("the frozen diff holds other bytes than the writer wrote")
	}
}

// TestOverlayPastItsMemoryBoundFailsWrites: pages the overlay's file
// cannot take are held in memory up to maxPending bytes; a write past that
// fails (ENOSPC), a read of its page fails rather than serve older bytes,
// and every freeze fails until the page is written again.
func TestOverlayPastItsMemoryBoundFailsWrites(t *testing.T) {
	run, filler := fullRunDir(t, 64<<10, 0)
	o, err := newOverlay(run, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer o.close()
	o.maxPending = pageBytes
	page := func(b byte) []byte {
		p := make([]byte, pageBytes)
		p[0] = b
		return p
	}
	if errno := o.write(page(1), 0); errno != 0 {
		t.Fatalf("write within the bound: %v", errno)
	}
	if errno := o.write(page(2), 5*pageBytes); errno != syscall.ENOSPC {
		t.Errorf("write past the bound: %v, want ENOSPC", errno)
	}
	buf := make([]byte, 6*pageBytes)
	if err := o.patch(buf, 0); err == nil {
		t.Error("patch over a page that could not be kept: no error")
	}
	if err := o.patch(buf[:pageBytes], 0); err != nil || buf[0] != 1 {
		t.Errorf("patch of the page held in memory: %v, byte %d; want 1", err, buf[0])
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := o.freeze(filepath.Join(t.TempDir(), "d1")); err == nil {
		t.Error("freeze with a page not kept: no error")
	}
	if errno := o.write(page(3), 5*pageBytes); errno != 0 {
		t.Fatalf("write again with room: %v", errno)
	}
	got, err := o.freeze(filepath.Join(t.TempDir(), "d2"))
	if err != nil || len(got) != 2 {
		t.Errorf("freeze with every page kept = %v, %v; want pages 0 and 5", got, err)
	}
	if err := o.patch(buf, 0); err != nil || buf[0] != 1 || buf[5*pageBytes] != 3 {
		t.Errorf("patch after the freeze: %v, bytes %d and %d; want 1 and 3", err, buf[0], buf[5*pageBytes])
	}
}
