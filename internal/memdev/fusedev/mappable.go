package fusedev

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotMappable is wrapped by CheckMappable when the kernel refuses to map
// a device file the way the VMM maps guest memory.
var ErrNotMappable = errors.New("memory device file cannot be mapped by the VMM")

// CheckMappable maps the device file at path MAP_PRIVATE, as Firecracker's
// File backend does, and unmaps it again without touching a byte, so it is
// safe in the process that serves the file. On io_engine 2 (FOPEN_DIRECT_IO)
// the kernel may refuse the mapping (ENODEV); the error then wraps
// ErrNotMappable and says which io_engine to use instead.
//
// On a direct I/O file even a successful probe drops the file's page cache,
// as every mmap of such a file does.
func CheckMappable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("check mappable %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("check mappable %s: %w", path, err)
	}
	length := int(min(fi.Size(), int64(os.Getpagesize())))
	if length <= 0 {
		return fmt.Errorf("check mappable %s: %w: file is empty", path, ErrNotMappable)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		if errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("check mappable %s: %w: the kernel refuses to map a FOPEN_DIRECT_IO file "+
				"(io_engine 2) MAP_PRIVATE; use io_engine 0 or 1: %v", path, ErrNotMappable, err)
		}
		return fmt.Errorf("check mappable %s: %w: %v", path, ErrNotMappable, err)
	}
	if err := unix.Munmap(mem); err != nil {
		return fmt.Errorf("check mappable %s: unmap: %w", path, err)
	}
	return nil
}
