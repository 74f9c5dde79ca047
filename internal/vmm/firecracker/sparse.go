package firecracker

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"warmstart/internal/layers"
)

// diffPageBytes is the unit of a Diff memory file: Firecracker dumps dirty
// pages of the host's page size (host_page_size() in
// src/vmm/src/vstate/memory.rs, dump_dirty), 4 KiB on the hosts it runs on.
const diffPageBytes = 4096

// holeProbeFileBytes is the size of the file the hole probe writes into:
// larger than a 2 MiB huge page, so a file system that allocates (and
// reports as data) a whole huge page or a large block around one written
// page is caught.
const holeProbeFileBytes = 4 << 20

// holeProbeOffsets are the pages the probe writes: odd 4 KiB pages, so no
// allocation unit larger than a page fits around them without taking in
// unwritten bytes.
var holeProbeOffsets = []int64{3 * diffPageBytes, holeProbeFileBytes - 5*diffPageBytes}

// ErrInexactHoles: the file system of a Diff's directory does not report
// exactly the pages written into a sparse file (SEEK_DATA/SEEK_HOLE count
// whole allocation units, or the whole file, as data). A Diff's changed
// pages are found that way, so there it would name unchanged pages as
// changed and the child would record them as zero.
var ErrInexactHoles = errors.New("the file system does not report the holes of a sparse file exactly")

// checkExactHoles writes, in dir, a sparse file the way Firecracker writes
// a Diff memory file (set_len, then page writes at their offsets, then
// sync_all) and checks that SEEK_DATA and SEEK_HOLE report exactly the
// pages written.
func checkExactHoles(dir string) error {
	f, err := os.CreateTemp(dir, ".holes-probe-*")
	if err != nil {
		return fmt.Errorf("probe the holes of %s: %w", dir, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	err = f.Truncate(holeProbeFileBytes)
	page := make([]byte, diffPageBytes)
	for i := range page {
		page[i] = 0xa5
	}
	for _, off := range holeProbeOffsets {
		if err == nil {
			_, err = f.WriteAt(page, off)
		}
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		return fmt.Errorf("probe the holes of %s: %w", dir, err)
	}
	got, err := dataPages(f)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInexactHoles, dir, err)
	}
	want := make([]int64, len(holeProbeOffsets))
	for i, off := range holeProbeOffsets {
		want[i] = off / diffPageBytes
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("%w: in %s, a %d-byte file with pages %v written reports %d pages of data (%s)",
			ErrInexactHoles, dir, int64(holeProbeFileBytes), want, len(got), describePages(got))
	}
	return nil
}

// describePages is a short account of a page list for an error.
func describePages(pages []int64) string {
	if len(pages) == 0 {
		return "none"
	}
	return fmt.Sprintf("pages %d to %d", pages[0], pages[len(pages)-1])
}

// dataPages lists the 4 KiB pages a Diff memory file holds
// (layers.SparsePages: whole pages only).
func dataPages(f *os.File) ([]int64, error) { return layers.SparsePages(f) }
