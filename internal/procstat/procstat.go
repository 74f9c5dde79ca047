// Package procstat reads what a process has cost the host so far: its CPU
// time (user and system), its page faults and the bytes it read, from
// getrusage(2) for this process and from /proc for another one. A
// restore takes one reading at its start and one at ready and reports
// the difference (package restore's Cost).
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Usage is a process's cumulative cost at one moment.
type Usage struct {
	// User and System are CPU time spent in user space and in the kernel.
	User   time.Duration `json:"user_ns"`
	System time.Duration `json:"system_ns"`
	// MinorFaults and MajorFaults are page faults served without and with
	// waiting for I/O (a FUSE round trip counts as major).
	MinorFaults int64 `json:"minor_faults"`
	MajorFaults int64 `json:"major_faults"`
	// StorageReadBytes are bytes the process caused to be read from a
	// block device (/proc/PID/io read_bytes): page-cache misses, including
	// the readahead they started.
	StorageReadBytes int64 `json:"storage_read_bytes"`
}

// CPU is User plus System.
func (u Usage) CPU() time.Duration { return u.User + u.System }

// Sub is what was spent between an earlier reading o and u.
func (u Usage) Sub(o Usage) Usage {
	return Usage{
		User: u.User - o.User, System: u.System - o.System,
		MinorFaults: u.MinorFaults - o.MinorFaults, MajorFaults: u.MajorFaults - o.MajorFaults,
		StorageReadBytes: u.StorageReadBytes - o.StorageReadBytes,
	}
}

// Add is u and o together: two processes' usage over one window.
func (u Usage) Add(o Usage) Usage {
	return Usage{
		User: u.User + o.User, System: u.System + o.System,
		MinorFaults: u.MinorFaults + o.MinorFaults, MajorFaults: u.MajorFaults + o.MajorFaults,
		StorageReadBytes: u.StorageReadBytes + o.StorageReadBytes,
	}
}

// Self reads this process's usage (every thread, microsecond CPU times).
func Self() (Usage, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return Usage{}, fmt.Errorf("getrusage: %w", err)
	}
	u := Usage{
		User:        time.Duration(ru.Utime.Nano()),
		System:      time.Duration(ru.Stime.Nano()),
		MinorFaults: ru.Minflt,
		MajorFaults: ru.Majflt,
	}
	// /proc/self/io is missing on kernels without task I/O accounting:
	// the CPU and faults still stand.
	u.StorageReadBytes, _ = storageReadBytes("/proc/self/io")
	return u, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times; Linux
// reports 100 on every architecture Go supports.
const clockTicks = 100

// Process reads another process's usage from /proc/PID/stat (CPU times
// in clock ticks, 10 ms) and /proc/PID/io. Its total CPU time is refined
// to nanoseconds from the threads' schedstat, when the kernel keeps it.
func Process(pid int) (Usage, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	data, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return Usage{}, fmt.Errorf("read process %d's stat: %w", pid, err)
	}
	u, err := parseStat(data)
	if err != nil {
		return Usage{}, fmt.Errorf("process %d's stat: %w", pid, err)
	}
	if ns, ok := schedCPU(dir); ok && u.CPU() > 0 {
		// Split the precise total in the ticks' user/system proportion.
		total := u.CPU()
		u.User = time.Duration(float64(ns) * float64(u.User) / float64(total))
		u.System = ns - u.User
	} else if ok {
		u.User = ns
	}
	u.StorageReadBytes, _ = storageReadBytes(filepath.Join(dir, "io"))
	return u, nil
}

// parseStat reads the fields of /proc/PID/stat that Usage keeps. The
// command name (field 2) may hold spaces and parentheses: the fields are
// counted after its last ')'.
func parseStat(data []byte) (Usage, error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return Usage{}, fmt.Errorf("no command name in %q", data)
	}
	f := strings.Fields(string(data[i+1:]))
	// f[0] is field 3 (state); minflt is field 10, majflt 12, utime 14,
	// stime 15.
	if len(f) < 13 {
		return Usage{}, fmt.Errorf("%d fields after the command name, want at least 13", len(f))
	}
	var n [4]int64
	for j, idx := range []int{7, 9, 11, 12} {
		v, err := strconv.ParseInt(f[idx], 10, 64)
		if err != nil {
			return Usage{}, fmt.Errorf("field %d: %w", idx+3, err)
		}
		n[j] = v
	}
	tick := time.Second / clockTicks
	return Usage{MinorFaults: n[0], MajorFaults: n[1], User: time.Duration(n[2]) * tick, System: time.Duration(n[3]) * tick}, nil
}

// schedCPU sums the on-CPU nanoseconds of dir's threads
// (task/*/schedstat, first field).
func schedCPU(dir string) (time.Duration, bool) {
	tasks, err := filepath.Glob(filepath.Join(dir, "task", "*", "schedstat"))
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var sum int64
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited since the glob
		}
		f := strings.Fields(string(data))
		if len(f) == 0 {
			return 0, false
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += v
	}
	return time.Duration(sum), true
}

// storageReadBytes is the read_bytes line of a /proc/PID/io file.
func storageReadBytes(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "read_bytes: "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no read_bytes", path)
}
