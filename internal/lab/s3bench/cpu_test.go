package s3bench

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// rusageCPU is this process's user and system time as getrusage counts it.
func rusageCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestCPUTime: this process's CPU time, read from its threads' schedstat,
// grows as getrusage's does while it spins (whatever share of a core a
// loaded host gives it), and a process that does not exist has none.
func TestCPUTime(t *testing.T) {
	const spin = 40 * time.Millisecond
	before, ruBefore := cpuTime(os.Getpid()), rusageCPU(t)
	for rusageCPU(t)-ruBefore < spin {
	}
	got, ru := cpuTime(os.Getpid())-before, rusageCPU(t)-ruBefore
	if got < spin/2 || got > 2*ru+10*time.Millisecond {
		t.Errorf("spun %v of CPU (getrusage), schedstat counted %v", ru, got)
	}
	if got := cpuTime(0); got != 0 {
		t.Errorf("pid 0: %v", got)
	}
	if got := cpuTime(1 << 30); got != 0 {
		t.Errorf("no such process: %v", got)
	}
}
