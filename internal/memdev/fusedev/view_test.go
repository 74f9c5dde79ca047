package fusedev

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
)

// TestWritableViewKeepsWritesInItsOverlay: another process writes pages
// through a shared writable mapping of a view and exits without syncing;
// Flush brings the dirty pages to the device, FreezeWritten copies exactly
// them (and clears the set), a re-read after the page cache dropped them
// sees the written bytes from the overlay, while a read-only generation
// of the same memory and the lower file see none of it.
func TestWritableViewKeepsWritesInItsOverlay(t *testing.T) {
	const fileBytes = 4 << 20
	lower := writeLower(t, fileBytes, 17)
	lay := layout.Single(fileBytes)
	pages := []int64{0, 7 * pageBytes, 8 * pageBytes, 300 * pageBytes, fileBytes - pageBytes}
	wantWhole := lowerHash(t, lower, []int64{0}, fileBytes)
	srv := newServer(t, Options{AllowWriteOpen: true})
	run := t.TempDir()
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Writable, req.RunDir = true, run
	view, err := srv.Attach("snap", req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, view.release()) }()
	shared := attach(t, srv, "snap", lower, memdev.IOEngineBuffered)
	defer func() { waitAck(t, shared.release()) }()
	if view.Path() == shared.Path() {
		t.Fatalf("the view shares its file %s with a read-only attach", view.Path())
	}

	writer := childSpec{Mode: childMmap, Path: view.Path(), Layout: lay, Pages: pages, Shared: true, ReadWrite: true, Write: true}
	if res := runChildSpec(t, writer); res.Err != "" {
		t.Fatalf("writer: %s", res.Err)
	}
	if err := view.Flush(); err != nil {
		t.Fatal(err)
	}
	diff := filepath.Join(t.TempDir(), "memory.diff")
	got, err := view.FreezeWritten(diff)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]int64, len(pages))
	for i, off := range pages {
		want[i] = off / pageBytes
	}
	if !slices.Equal(got, want) {
		t.Fatalf("FreezeWritten = %v, want pages %v", got, want)
	}
	written := writtenBytes(t, lower, pages)
	if h := hashAt(t, diff, pages); h != written {
		t.Errorf("the frozen diff holds other bytes than the writer wrote")
	}
	if again, err := view.FreezeWritten(filepath.Join(t.TempDir(), "again")); err != nil || len(again) != 0 {
		t.Errorf("a second freeze = %v, %v; want no page", again, err)
	}

	dropCache(t, view.Path())
	if res := runChildSpec(t, childSpec{Mode: childRead, Path: view.Path(), Pages: pages}); res.Err != "" || res.Hash != written {
		t.Errorf("re-read of the view after eviction: hash %s err %q, want the written bytes", res.Hash, res.Err)
	}
	if res := runChildSpec(t, childSpec{Mode: childRead, Path: shared.Path(), Pages: pages}); res.Hash != lowerHash(t, lower, pages, pageBytes) {
		t.Errorf("the read-only generation sees the view's writes")
	}
	if lowerHash(t, lower, []int64{0}, fileBytes) != wantWhole {
		t.Error("the lower file changed")
	}
}

// writtenBytes is the hash of lower's pages at offsets with their first
// byte flipped, as childMmap's Write leaves them.
func writtenBytes(t *testing.T, lower string, offsets []int64) string {
	t.Helper()
	data, err := os.ReadFile(lower)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	for _, off := range offsets {
		page := bytes.Clone(data[off : off+pageBytes])
		page[0] ^= 0xff
		h.Write(page)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func hashAt(t *testing.T, path string, offsets []int64) string {
	t.Helper()
	return lowerHash(t, path, offsets, pageBytes)
}

// dropCache asks the kernel to drop the file's clean cached pages; the
// file is opened, not mapped, so this process touches none of them.
func dropCache(t testing.TB, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}

// TestWritableViewIsNeverPassthrough: on a passthrough mount a pausable
// restore's view is still served by the device, so the guest's writes
// land in its overlay and the lower file stays as published.
func TestWritableViewIsNeverPassthrough(t *testing.T) {
	const fileBytes = 4 << 20
	lower := writeLower(t, fileBytes, 19)
	lay := layout.Single(fileBytes)
	pages := []int64{0, 9 * pageBytes}
	wantWhole := lowerHash(t, lower, []int64{0}, fileBytes)
	srv := newServer(t, Options{AllowWriteOpen: true, Passthrough: true})
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Writable, req.RunDir = true, t.TempDir()
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
		t.Fatal(err)
	}
	if view.Passthrough() || view.Counters().ReadRequests == 0 {
		t.Fatalf("writable view: passthrough %v, %+v served; want the device to serve it", view.Passthrough(), view.Counters())
	}
	if got, err := view.FreezeWritten(filepath.Join(t.TempDir(), "memory.diff")); err != nil || len(got) != len(pages) {
		t.Fatalf("FreezeWritten = %v, %v; want the %d written pages", got, err, len(pages))
	}
	if lowerHash(t, lower, []int64{0}, fileBytes) != wantWhole {
		t.Error("the lower file changed")
	}
}

// TestWritableViewIsNeverFilled: a fill stores lower-file bytes into the
// page cache over whatever a page holds, and a writable view's page cache
// holds the guest's writes: a fill between its check of the served pages
// and its store would put the published bytes back over a page the guest
// faulted in and wrote meanwhile (a restore's guest lost part of a 16 MiB
// write that way, with prefetch and miss fills racing its faults). So a
// view refuses fills, and its prefetch target reads through the file,
// which never replaces a cached page.
func TestWritableViewIsNeverFilled(t *testing.T) {
	const fileBytes = 4 << 20
	lower := writeLower(t, fileBytes, 23)
	srv := newServer(t, Options{AllowWriteOpen: true})
	req := fileReq(lower, memdev.IOEngineBuffered)
	req.Writable, req.RunDir = true, t.TempDir()
	view, err := srv.Attach("snap", req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { waitAck(t, view.release()) }()
	page := int64(40 * pageBytes)
	// The target keeps the file open, so the kernel has its inode.
	target, done, err := view.Target(nil, memdev.TargetOptions{Fill: true})
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if err := view.Fill(page, make([]byte, pageBytes)); !errors.Is(err, ErrNotCached) {
		t.Errorf("Fill of a writable view = %v, want ErrNotCached", err)
	}
	if err := target.Fetch(t.Context(), page, make([]byte, pageBytes)); err != nil {
		t.Errorf("prefetch of a writable view with Fill: %v, want a read through the file", err)
	}
}
