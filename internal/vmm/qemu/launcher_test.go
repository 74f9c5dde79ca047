package qemu

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"warmstart/internal/reexec"

	"golang.org/x/sys/unix"
)

// probeEnv makes the test binary a process that advises a mapping
// MADV_HUGEPAGE and reports what happened (see runAdviceProbe): with
// "filter" it first installs the launcher's filter itself, with "probe" it
// only reports (it is started through the launcher).
const probeEnv = "WARMSTART_QEMU_TEST_ADVICE"

// The probe runs from package initialisation, where the main goroutine is
// locked to the main thread: the parent-death signal is a property of that
// thread (threads QEMU or the Go runtime start later carry none). A
// process that is to play a role first (the launcher the probe is started
// through) leaves it to TestMain's dispatch.
func init() {
	if mode := os.Getenv(probeEnv); mode != "" && os.Getenv(reexec.Env) == "" {
		os.Exit(runAdviceProbe(mode))
	}
}

// adviceReport is what an advice probe saw.
type adviceReport struct {
	pid       int
	advice    string // "ok" or the errno of madvise(MADV_HUGEPAGE)
	other     string // the same for madvise(MADV_NOHUGEPAGE)
	hg        bool   // the mapping's VmFlags show "hg"
	pdeathsig int
	role      string // reexec.Env as the probe sees it
}

// runAdviceProbe maps 4 MiB of anonymous memory, advises half of it
// MADV_NOHUGEPAGE and all of it MADV_HUGEPAGE, and prints a report line.
func runAdviceProbe(mode string) int {
	if mode == "filter" {
		if err := denyHugePageAdvice(); err != nil {
			fmt.Println("ERROR", err)
			return 1
		}
	}
	const size = 4 << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	errName := func(err error) string {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return unix.ErrnoName(errno)
		}
		if err != nil {
			return err.Error()
		}
		return "ok"
	}
	other := errName(unix.Madvise(mem[:size/2], unix.MADV_NOHUGEPAGE))
	advice := errName(unix.Madvise(mem, unix.MADV_HUGEPAGE))
	flags, err := vmFlagsAt(os.Getpid(), uintptr(unsafe.Pointer(&mem[size-1])))
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	// PR_GET_PDEATHSIG stores the signal through its argument.
	var pdeath int32
	if err := unix.Prctl(unix.PR_GET_PDEATHSIG, uintptr(unsafe.Pointer(&pdeath)), 0, 0, 0); err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Printf("REPORT pid=%d advice=%s other=%s hg=%t pdeathsig=%d role=%q\n",
		os.Getpid(), advice, other, slices.Contains(flags, "hg"), pdeath, os.Getenv(reexec.Env))
	return 0
}

func parseAdviceReport(line string) (adviceReport, error) {
	var r adviceReport
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "REPORT ") {
		return r, fmt.Errorf("probe said %q", line)
	}
	for _, field := range strings.Fields(line)[1:] {
		k, v, _ := strings.Cut(field, "=")
		var err error
		switch k {
		case "pid":
			r.pid, err = strconv.Atoi(v)
		case "advice":
			r.advice = v
		case "other":
			r.other = v
		case "hg":
			r.hg, err = strconv.ParseBool(v)
		case "pdeathsig":
			r.pdeathsig, err = strconv.Atoi(v)
		case "role":
			r.role, err = strconv.Unquote(v)
		}
		if err != nil {
			return r, fmt.Errorf("probe report %q: %s: %w", line, k, err)
		}
	}
	return r, nil
}

// vmFlagsAt returns the VmFlags of the mapping of pid holding addr.
func vmFlagsAt(pid int, addr uintptr) ([]string, error) {
	maps, err := readSmaps(pid)
	if err != nil {
		return nil, err
	}
	for _, m := range maps {
		if addr >= m.start && addr < m.end {
			return m.flags, nil
		}
	}
	return nil, fmt.Errorf("no mapping of pid %d holds %#x", pid, addr)
}

// smapsEntry is one mapping of /proc/PID/smaps.
type smapsEntry struct {
	start, end  uintptr
	path        string
	flags       []string
	thpEligible string
}

func readSmaps(pid int) ([]smapsEntry, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []smapsEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		switch {
		case fields[0] == "VmFlags:" && len(out) > 0:
			out[len(out)-1].flags = fields[1:]
		case fields[0] == "THPeligible:" && len(out) > 0 && len(fields) > 1:
			out[len(out)-1].thpEligible = fields[1]
		case strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":"):
			lo, hi, _ := strings.Cut(fields[0], "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			e := smapsEntry{start: uintptr(start), end: uintptr(end)}
			if len(fields) >= 6 {
				e.path = strings.Join(fields[5:], " ")
			}
			out = append(out, e)
		}
	}
	return out, sc.Err()
}

// probe runs the test binary as an advice probe: directly with mode
// "filter", or through the launcher with mode "probe".
func probe(t *testing.T, mode string, viaLauncher bool) adviceReport {
	t.Helper()
	var cmd *exec.Cmd
	if viaLauncher {
		path, argv, env := launcherCommand(os.Args[0], []string{"-test.run=^$"})
		cmd = exec.Command(path)
		cmd.Args, cmd.Env = argv, env
	} else {
		cmd = exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = os.Environ()
	}
	// Under -race a process sleeps a second on exit unless told not to.
	cmd.Env = append(cmd.Env, probeEnv+"="+mode, "GORACE=atexit_sleep_ms=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("advice probe: %v: %s", err, out)
	}
	r, err := parseAdviceReport(string(out))
	if err != nil {
		t.Fatal(err)
	}
	if r.pid != cmd.Process.Pid {
		t.Errorf("probe ran as pid %d, the process started was %d: the launcher did not exec in place", r.pid, cmd.Process.Pid)
	}
	return r
}

func TestHugePageFilter(t *testing.T) {
	t.Run("without", func(t *testing.T) {
		r := probe(t, "probe", false)
		if r.advice != "ok" || !r.hg {
			t.Fatalf("unfiltered MADV_HUGEPAGE: %s, hg %v; want it accepted and the mapping flagged", r.advice, r.hg)
		}
	})
	t.Run("with", func(t *testing.T) {
		r := probe(t, "filter", false)
		if r.advice != "EINVAL" || r.hg {
			t.Errorf("filtered MADV_HUGEPAGE: %s, hg %v; want EINVAL and no flag", r.advice, r.hg)
		}
		if r.other != "ok" {
			t.Errorf("filtered MADV_NOHUGEPAGE: %s; other advice must pass", r.other)
		}
	})
}

// TestLauncherExecsQEMUInPlace starts the probe as QEMU would be started:
// the filter must hold across the exec, which keeps the pid and the
// parent-death signal and drops the launcher's role.
func TestLauncherExecsQEMUInPlace(t *testing.T) {
	r := probe(t, "probe", true)
	if r.advice != "EINVAL" || r.hg {
		t.Errorf("MADV_HUGEPAGE behind the launcher: %s, hg %v; want EINVAL and no flag", r.advice, r.hg)
	}
	if r.other != "ok" {
		t.Errorf("MADV_NOHUGEPAGE behind the launcher: %s", r.other)
	}
	if r.pdeathsig != int(syscall.SIGKILL) {
		t.Errorf("parent-death signal after the exec is %d, want SIGKILL", r.pdeathsig)
	}
	if r.role != "" {
		t.Errorf("the launched program sees %s=%q", reexec.Env, r.role)
	}
}

func TestLauncherReportsExecFailure(t *testing.T) {
	path, argv, env := launcherCommand("/nonexistent/qemu", nil)
	cmd := exec.Command(path)
	cmd.Args, cmd.Env = argv, env
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != launcherFailedStatus {
		t.Fatalf("launcher of a missing binary: %v, want exit status %d", err, launcherFailedStatus)
	}
	if !strings.Contains(string(out), "exec /nonexistent/qemu") {
		t.Errorf("launcher said %q, want the failed exec named", out)
	}
}

// TestRestoredGuestMemoryNotHugePageAdvised restores the captured guest
// with and without the launcher and looks at QEMU's mapping of the memory
// file: by default it must carry no huge-page advice and no huge-page
// eligibility, as under Firecracker's File backend.
func TestRestoredGuestMemoryNotHugePageAdvised(t *testing.T) {
	f := captured(t)
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("KeepHugePageAdvice=%v", keep), func(t *testing.T) {
			d, err := New(Options{KeepHugePageAdvice: keep})
			if err != nil {
				t.Fatal(err)
			}
			// The subtest's name makes t.TempDir too long for the QMP
			// socket under it (108 bytes) when TMPDIR is long.
			dir := shortTempDir(t)
			mem := filepath.Join(dir, "memory.bin")
			f.copyMemory(t, mem)
			m, _ := restoreReady(t, d, f, dir, mem)
			defer func() {
				pid := m.PID()
				m.kill()
				assertGone(t, pid, dir)
			}()
			maps, err := readSmaps(m.PID())
			if err != nil {
				t.Fatal(err)
			}
			var guestRAM *smapsEntry
			for i := range maps {
				if maps[i].path == mem {
					guestRAM = &maps[i]
				}
			}
			if guestRAM == nil || guestRAM.end-guestRAM.start != uintptr(d.MemoryBytes()) {
				t.Fatalf("no %d-byte mapping of %s in QEMU's smaps (found %+v)", d.MemoryBytes(), mem, guestRAM)
			}
			hg := slices.Contains(guestRAM.flags, "hg")
			if hg != keep {
				t.Errorf("guest RAM VmFlags %v: hg %v, want %v", guestRAM.flags, hg, keep)
			}
			if !keep && guestRAM.thpEligible != "0" {
				t.Errorf("guest RAM THPeligible %q, want 0", guestRAM.thpEligible)
			}
		})
	}
}

// shortTempDir is a temporary directory with a path short enough for the
// Unix sockets under it; t.TempDir's holds the test's name.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "wsq-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
