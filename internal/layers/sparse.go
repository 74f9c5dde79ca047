package layers

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// SparsePages lists, ascending, the pages of f that SEEK_DATA and SEEK_HOLE
// report as data: the pages a sparse diff file (a VMM's dump of the pages
// a guest changed) holds. A data extent that does not start and end on a
// page boundary (other than at the end of the file) is an error: a diff
// holds whole pages. The answer is only as exact as the file system's
// holes; a caller that cannot trust them checks the file system first.
func SparsePages(f *os.File) ([]int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	fd := int(f.Fd())
	var pages []int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("SEEK_DATA at %d: %w", off, err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("SEEK_HOLE at %d: %w", data, err)
		}
		if data%PageBytes != 0 || (hole%PageBytes != 0 && hole != size) {
			return nil, fmt.Errorf("data extent [%d, %d) is not whole pages", data, hole)
		}
		for p := data / PageBytes; p*PageBytes < hole; p++ {
			pages = append(pages, p)
		}
		off = hole
	}
	return pages, nil
}
