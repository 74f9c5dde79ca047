package procstat

import (
	"bufio"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSelfCountsCPUThisProcessSpends(t *testing.T) {
	before, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the kernel's own process clock says 30 ms were spent: on
	// a loaded host the wall clock says nothing about CPU.
	start := processClock(t)
	for processClock(t)-start < 30*time.Millisecond {
	}
	after, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if d := after.Sub(before); d.CPU() < 25*time.Millisecond {
		t.Fatalf("30 ms of CPU counted as %v", d.CPU())
	}
}

// processClock is CLOCK_PROCESS_CPUTIME_ID.
func processClock(t *testing.T) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

func TestProcessReadsAnotherProcessesCPU(t *testing.T) {
	// The child spins, says so, and waits on its stdin until we have read it.
	cmd := exec.Command("sh", "-c", `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; echo spun; read x`)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "spun\n" {
		t.Fatalf("child said %q, %v", line, err)
	}
	u, err := Process(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if u.CPU() < time.Millisecond || u.MinorFaults == 0 {
		t.Fatalf("a shell that counted to 100000 is reported as %+v", u)
	}
}

func TestProcessOfNoProcessIsAnError(t *testing.T) {
	if _, err := Process(-1); err == nil {
		t.Fatal("no error for pid -1")
	}
}

func TestParseStatCountsFieldsAfterTheCommandName(t *testing.T) {
	// A command name with spaces and a ')' must not shift the fields.
	line := "42 (a) b (c) S 1 42 42 0 -1 4194560 310 0 7 0 250 125 0 0 20 0 1 0 100 1000 10\n"
	u, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Usage{MinorFaults: 310, MajorFaults: 7, User: 2500 * time.Millisecond, System: 1250 * time.Millisecond}
	if u != want {
		t.Fatalf("parsed %+v, want %+v", u, want)
	}
	if _, err := parseStat([]byte("42 (x) S 1 2")); err == nil {
		t.Fatal("a truncated stat line parsed")
	}
}
