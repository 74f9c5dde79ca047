package replay

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/layout"
	"warmstart/internal/trace"
	"warmstart/internal/vmm"
)

// TestReplayPauseDumpsWrittenPages: a replay VMM with a write stamp,
// paused and dumped, writes exactly its written pages, each stamped, into
// a sparse diff (a second dump holds none); it runs again after the thaw;
// and a replay of the memory with the diff applied reads the stamped
// pages, as ExpectedHash over that memory says.
func TestReplayPauseDumpsWrittenPages(t *testing.T) {
	p := reference(t, 8)
	var entries []trace.Entry
	var written []int64
	for i := range 200 {
		e := trace.Entry{Offset: int64(i) * 7 * trace.PageBytes, Write: i%4 == 1}
		if e.Write {
			written = append(written, e.Offset)
		}
		entries = append(entries, e)
	}
	tracePath := filepath.Join(t.TempDir(), "trace")
	if err := trace.WriteFile(tracePath, entries); err != nil {
		t.Fatal(err)
	}
	const stamp = 0xfeed
	spec := fileSpec(p.Memory, layout.Single(testMemoryBytes))
	spec.VMStatePath = p.VMState
	inst := start(t, t.Context(), &VMM{TracePath: tracePath, WriteStamp: stamp}, spec)
	if _, err := inst.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := inst.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	diff, err := inst.SaveDiff(t.Context(), vmm.DiffSpec{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := dataOffsets(t, diff.MemoryDiffPath); !slices.Equal(got, written) {
		t.Fatalf("diff holds pages at %v, want the written ones %v", got, written)
	}
	child := applyDiff(t, p.Memory, diff.MemoryDiffPath, written)
	for _, off := range written {
		page := make([]byte, trace.PageBytes)
		readAt(t, child, page, off)
		if !bytes.Equal(page[:8], stampBytes(stamp, off)) {
			t.Fatalf("page at %d starts %x, want the stamp %x", off, page[:8], stampBytes(stamp, off))
		}
	}
	if err := inst.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := inst.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	again, err := inst.SaveDiff(t.Context(), vmm.DiffSpec{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if got := dataOffsets(t, again.MemoryDiffPath); len(got) != 0 {
		t.Fatalf("a second dump holds pages at %v, want none", got)
	}
	if err := inst.Resume(); err != nil {
		t.Fatal(err)
	}
	inst.RequestStop()
	if err := inst.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}

	want, err := ExpectedHash(child, entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	replayed := start(t, t.Context(), &VMM{TracePath: tracePath}, fileSpec(child, layout.Single(testMemoryBytes)))
	info, err := replayed.WaitReady(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Detail.SHA256 != want {
		t.Fatalf("replay of the child read hash %s, want %s", info.Detail.SHA256, want)
	}
}

// dataOffsets lists the offsets of a sparse file's data pages.
func dataOffsets(t *testing.T, path string) []int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	var offs []int64
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: no data after off
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		for o := data; o < hole; o += trace.PageBytes {
			offs = append(offs, o)
		}
		off = hole
	}
	return offs
}

// applyDiff writes a copy of mem with the diff's pages at offsets.
func applyDiff(t *testing.T, mem, diff string, offsets []int64) string {
	t.Helper()
	data, err := os.ReadFile(mem)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range offsets {
		readAt(t, diff, data[off:off+trace.PageBytes], off)
	}
	out := filepath.Join(t.TempDir(), "child-memory")
	if err := os.WriteFile(out, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

func readAt(t *testing.T, path string, buf []byte, off int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
}
