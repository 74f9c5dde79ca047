package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/lab/bench"
	"warmstart/internal/lab/miniotest"
)

const (
	// reachTimeout bounds how long a CLI may take to reach a trial.
	reachTimeout = 2 * time.Minute
	// stopTimeout is how promptly a signalled CLI must have stopped,
	// cleaned up and exited.
	stopTimeout = 15 * time.Second
)

// TestBenchInterrupt signals warmstart bench while one of its trials is
// running: it exits 128+signal with no FUSE mount, temporary directory or
// process of its own left.
func TestBenchInterrupt(t *testing.T) {
	for _, c := range []struct {
		name   string
		sig    syscall.Signal
		device string
	}{
		{"SIGINT/file", syscall.SIGINT, "file"},
		{"SIGINT/uffd", syscall.SIGINT, "uffd"},
		{"SIGTERM/file", syscall.SIGTERM, "file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cli := startCLI(t, c.device == "uffd", "bench", "--blocks", "3", "--memory-size", "8MiB",
				"--policies", "seed", "--device", c.device)
			cli.waitTrialMount()
			cli.signal(c.sig)
			cli.wantExit(128+int(c.sig), c.sig)
			cli.wantNothingLeft(0)
		})
	}
}

// TestDemoInterrupt signals warmstart demo during its closing benchmark.
func TestDemoInterrupt(t *testing.T) {
	cli := startCLI(t, false, "demo", "--blocks", "2")
	cli.waitTrialMount()
	cli.signal(syscall.SIGINT)
	cli.wantExit(130, syscall.SIGINT)
	cli.wantNothingLeft(0)
}

// TestBenchS3Interrupt signals bench --repository s3 between two of its
// in-process trials: MinIO, the proxy and the mounts go with the work
// directory.
func TestBenchS3Interrupt(t *testing.T) {
	miniotest.Require(t)
	// bench --repository s3 execs the companion command that holds the
	// MinIO/Toxiproxy harness; this test binary has none beside it.
	t.Setenv(bench.S3BinaryEnv, filepath.Join(buildCommands(t), bench.S3Command))
	cli := startCLI(t, false, "bench", "--repository", "s3", "--blocks", "3", "--memory-size", "8MiB", "--policies", "seed")
	cli.waitOutput("block 0 ") // a trial has ended; the next one runs
	cli.signal(syscall.SIGINT)
	cli.wantExit(130, syscall.SIGINT)
	cli.wantNothingLeft(0)
}

// TestBenchSecondInterrupt signals bench twice: the second signal cuts the
// trial's clean stop short, and still nothing is left and nothing hangs.
func TestBenchSecondInterrupt(t *testing.T) {
	cli := startCLI(t, false, "bench", "--blocks", "3", "--memory-size", "8MiB", "--policies", "seed")
	cli.waitTrialMount()
	cli.signal(syscall.SIGINT)
	// Two signals sent back to back may merge into one; the second is
	// sent once the first has been seen.
	cli.waitOutput("SIGINT: stopping")
	cli.signal(syscall.SIGINT)
	cli.wantExit(130, syscall.SIGINT)
	// A killed trial's VMM dies of its parent-death signal, which the
	// kernel delivers as the trial exits but which may still be at work.
	cli.wantNothingLeft(5 * time.Second)
}

// cliProcess is one warmstart process started by a test, with TMPDIR at root.
type cliProcess struct {
	t        *testing.T
	root     string
	cmd      *exec.Cmd
	lines    chan string // output lines not yet consumed by waitOutput
	mu       sync.Mutex
	output   strings.Builder
	exited   chan struct{}
	waitErr  error
	signaled time.Time
}

// startCLI starts "warmstart ARGS..." with TMPDIR set to a directory of
// the test's own. The test process becomes a child subreaper, so that any
// process the CLI leaves behind is reparented to it, where
// wantNothingLeft finds it. short asks for a short TMPDIR: a uffd
// restore's socket path must fit in 108 bytes, which t.TempDir's long
// names can exceed.
func startCLI(t *testing.T, short bool, args ...string) *cliProcess {
	t.Helper()
	root := t.TempDir()
	if short {
		var err error
		if root, err = os.MkdirTemp("", "wsi-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(root) })
	}
	t.Cleanup(func() { detachMountsBelow(t, root) })
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = cliEnv("TMPDIR="+root, "GORACE=atexit_sleep_ms=0")
	cmd.Stdout, cmd.Stderr = w, w
	// Its own process group, as a shell's job is: signalGroup then
	// reaches it and its children the way a terminal's Ctrl-C does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	c := &cliProcess{t: t, root: root, cmd: cmd, lines: make(chan string, 1<<16), exited: make(chan struct{})}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c.mu.Lock()
			fmt.Fprintln(&c.output, sc.Text())
			c.mu.Unlock()
			select {
			case c.lines <- sc.Text():
			default: // nobody waits for that much output
			}
		}
	}()
	go func() {
		<-readerDone
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("warmstart %s output:\n%s", strings.Join(args, " "), c.outputText())
		}
	})
	return c
}

func (c *cliProcess) outputText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.output.String()
}

// waitOutput waits for an output line containing s.
func (c *cliProcess) waitOutput(s string) {
	c.t.Helper()
	timeout := time.After(reachTimeout)
	for {
		select {
		case line := <-c.lines:
			if strings.Contains(line, s) {
				return
			}
		case <-c.exited:
			c.t.Fatalf("warmstart exited (%v) before printing %q", c.waitErr, s)
		case <-timeout:
			c.t.Fatalf("no output line with %q after %v", s, reachTimeout)
		}
	}
}

// waitTrialMount waits until a trial's FUSE mount is up below root: a
// trial is then in progress.
func (c *cliProcess) waitTrialMount() {
	c.t.Helper()
	c.waitMount("a trial's device", func(p string) bool {
		return strings.HasPrefix(p, c.root+"/") && strings.Contains(p, "/trial-")
	})
}

// waitMount waits until a mount point that match accepts is up. The
// kernel marks /proc/self/mountinfo with POLLPRI whenever the mount table
// changes, so no polling interval is needed.
func (c *cliProcess) waitMount(what string, match func(point string) bool) {
	c.t.Helper()
	f := openMountinfo(c.t)
	defer f.Close()
	deadline := time.Now().Add(reachTimeout)
	for {
		// A change after this read makes the poll below return at once.
		if slices.ContainsFunc(readMountPoints(c.t, f), match) {
			return
		}
		select {
		case <-c.exited:
			c.t.Fatalf("warmstart exited (%v) before it mounted %s", c.waitErr, what)
		default:
		}
		left := time.Until(deadline)
		if left <= 0 {
			c.t.Fatalf("warmstart did not mount %s within %v", what, reachTimeout)
		}
		// Wake up at least every second to notice an early exit.
		fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLPRI}}
		if _, err := unix.Poll(fds, int(min(left, time.Second)/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
			c.t.Fatal(err)
		}
	}
}

// openMountinfo opens /proc/self/mountinfo for poll(2), outside the Go
// runtime's poller: os.Open would register it there, and the runtime's
// own polling would then consume the change events.
func openMountinfo(t *testing.T) *os.File {
	t.Helper()
	fd, err := unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A blocking descriptor: os.NewFile leaves it out of the poller.
	return os.NewFile(uintptr(fd), "/proc/self/mountinfo")
}

func readMountPoints(t *testing.T, f *os.File) []string {
	t.Helper()
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) > 4 {
			points = append(points, fields[4])
		}
	}
	return points
}

func (c *cliProcess) signal(sig syscall.Signal) {
	c.t.Helper()
	if c.signaled.IsZero() {
		c.signaled = time.Now()
	}
	if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("send %v: %v", sig, err)
	}
}

// signalGroup sends sig to the CLI's process group, as a terminal's
// Ctrl-C does: to the CLI and every child it left in its group.
func (c *cliProcess) signalGroup(sig syscall.Signal) {
	c.t.Helper()
	if c.signaled.IsZero() {
		c.signaled = time.Now()
	}
	if err := syscall.Kill(-c.cmd.Process.Pid, sig); err != nil {
		c.t.Fatalf("send %v to process group %d: %v", sig, c.cmd.Process.Pid, err)
	}
}

// wantExit waits, at most stopTimeout after the first signal, for the CLI
// to exit with code, and for it to have said which signal stopped it.
func (c *cliProcess) wantExit(code int, sig syscall.Signal) {
	c.t.Helper()
	select {
	case <-c.exited:
	case <-time.After(time.Until(c.signaled.Add(stopTimeout))):
		c.t.Fatalf("warmstart still running %v after the signal", stopTimeout)
	}
	c.t.Logf("exited %v after the first signal: %v", time.Since(c.signaled).Round(time.Millisecond), c.waitErr)
	var ee *exec.ExitError
	if !errors.As(c.waitErr, &ee) || ee.ExitCode() != code {
		c.t.Errorf("warmstart ended with %v, want exit status %d", c.waitErr, code)
	}
	if want := "interrupted by " + unix.SignalName(sig); !strings.Contains(c.outputText(), want) {
		c.t.Errorf("output does not say %q", want)
	}
}

// wantNothingLeft checks that the exited CLI left no mount and no file
// below root, and no process running grace after its exit: every process
// it left would have been reparented to this one.
func (c *cliProcess) wantNothingLeft(grace time.Duration) {
	c.t.Helper()
	if mounts := mountPointsBelow(c.t, c.root); len(mounts) > 0 {
		c.t.Errorf("mounts left below %s: %v", c.root, mounts)
	}
	entries, err := os.ReadDir(c.root)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, e := range entries {
		c.t.Errorf("left in TMPDIR: %s", e.Name())
	}
	for _, pid := range reapOrphans(c.t, grace) {
		c.t.Errorf("process %d left running", pid)
	}
}

// reapOrphans reaps the children this process inherited as a subreaper,
// giving each up to grace to exit, and returns those still running, which
// it kills. Children that had already exited (zombies) count as gone.
func reapOrphans(t *testing.T, grace time.Duration) []int {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(grace)
	var running []int
	for _, path := range tasks {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // the thread has exited
		}
		for _, field := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(field)
			if err != nil {
				continue
			}
			if exitedWithin(pid, time.Until(deadline)) {
				continue
			}
			running = append(running, pid)
			t.Logf("killing leftover process %d: %s", pid, processName(pid))
			unix.Kill(pid, unix.SIGKILL)
			var ws unix.WaitStatus
			unix.Wait4(pid, &ws, 0, nil)
		}
	}
	return running
}

// exitedWithin reaps child pid if it exits within d.
func exitedWithin(pid int, d time.Duration) bool {
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		unix.Poll(fds, int(max(d, 0)/time.Millisecond))
		unix.Close(fd)
	}
	var ws unix.WaitStatus
	got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	return got == pid || errors.Is(err, unix.ECHILD)
}

func processName(pid int) string {
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
}

// detachMountsBelow aborts and detaches whatever a failed test left
// mounted below root, so that no server of its stays stuck and its
// directory can be removed.
func detachMountsBelow(t *testing.T, root string) {
	points := mountPointsBelow(t, root)
	for i := len(points) - 1; i >= 0; i-- {
		unix.Unmount(points[i], unix.MNT_FORCE)
		unix.Unmount(points[i], unix.MNT_DETACH)
	}
}
