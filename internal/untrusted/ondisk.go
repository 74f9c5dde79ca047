package untrusted

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ErrNotOnDisk is wrapped when a path lies on a pseudo file system (procfs,
// sysfs and the like), whose files report a size that is not their content:
// /proc/self/environ stats as 0 bytes and reads as many, a sysfs attribute
// stats as 4096 and reads as a few. Such a file is never a snapshot
// artifact, and copying it would only fail later as an integrity mismatch.
var ErrNotOnDisk = errors.New("not a file on disk")

// pseudoFileSystems names the kernel file systems whose files have no
// stored size.
var pseudoFileSystems = map[int64]string{
	unix.PROC_SUPER_MAGIC:    "procfs",
	unix.SYSFS_MAGIC:         "sysfs",
	unix.DEBUGFS_MAGIC:       "debugfs",
	unix.TRACEFS_MAGIC:       "tracefs",
	unix.SECURITYFS_MAGIC:    "securityfs",
	unix.CGROUP_SUPER_MAGIC:  "cgroupfs",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2fs",
	unix.BPF_FS_MAGIC:        "bpffs",
	unix.PSTOREFS_MAGIC:      "pstorefs",
	unix.EFIVARFS_MAGIC:      "efivarfs",
}

// CheckOnDisk refuses a path on a pseudo file system (ErrNotOnDisk), naming
// the file system.
func CheckOnDisk(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", path, err)
	}
	return onDisk(path, st)
}

// CheckFileOnDisk is CheckOnDisk for a file already open.
func CheckFileOnDisk(f *os.File) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("statfs %s: %w", f.Name(), err)
	}
	return onDisk(f.Name(), st)
}

func onDisk(path string, st unix.Statfs_t) error {
	if name, ok := pseudoFileSystems[int64(st.Type)]; ok {
		return fmt.Errorf("%s: %w: it is on %s, whose files do not have the size they report", path, ErrNotOnDisk, name)
	}
	return nil
}
