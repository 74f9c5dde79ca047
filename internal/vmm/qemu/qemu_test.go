package qemu

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/agentspec"
	"warmstart/internal/initramfs"
	"warmstart/internal/layout"
	"warmstart/internal/reexec"
	"warmstart/internal/vmm"
)

// Generous bounds: TCG guests on a loaded CI host are slow.
const (
	bootTimeout    = 3 * time.Minute
	restoreTimeout = time.Minute
)

// roleRestoringChild makes the test binary act as a process that restores
// a guest and is then killed (see TestParentDeathKillsQEMU).
const roleRestoringChild = "test-qemu-restoring-child"

func TestMain(m *testing.M) {
	reexec.Roles{
		RoleLauncher:       LauncherMain,
		roleRestoringChild: runChild,
	}.Dispatch()
	flag.Parse()
	code := m.Run()
	if fix.dir != "" {
		os.RemoveAll(fix.dir)
	}
	os.Exit(code)
}

// fixture is one guest booted and captured per test binary: booting under
// TCG takes seconds, restoring a fraction of one.
type fixture struct {
	dir      string
	initrd   string
	memPath  string // the captured memory file; tests restore from copies
	vmState  string
	token    string
	digest   string // of the agent's state, as the booted guest reported it
	uptimeMS int64
	bootTime time.Duration // QEMU start to the agent's first answer
	stateLen int64
	err      error
}

var (
	fix     fixture
	fixOnce sync.Once
)

// requireQEMU skips the test where no real guest can run, except under
// CI=true, where the real-guest tests must run and a missing QEMU fails.
func requireQEMU(t testing.TB) *Driver {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("CI") == "true" {
		skip = t.Fatalf
	}
	if _, err := exec.LookPath(DefaultBinary); err != nil {
		skip("%s not installed (apt-get install qemu-system-x86): %v", DefaultBinary, err)
	}
	if _, err := newestKernel(KernelGlob); err != nil {
		skip("no guest kernel under /boot (apt-get install linux-image-amd64): %v", err)
	}
	d, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// captured returns the shared captured guest, booting it on first use.
func captured(t testing.TB) *fixture {
	t.Helper()
	d := requireQEMU(t)
	fixOnce.Do(func() { fix.err = fix.build(d) })
	if fix.err != nil {
		t.Fatalf("boot and capture the shared guest: %v", fix.err)
	}
	return &fix
}

func (f *fixture) build(d *Driver) error {
	dir, err := os.MkdirTemp("", "qemu-fixture-")
	if err != nil {
		return err
	}
	f.dir = dir
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	if f.initrd, err = initramfs.Build(ctx, initramfs.Options{CacheDir: filepath.Join(dir, "initramfs")}); err != nil {
		return err
	}
	run := filepath.Join(dir, "boot")
	if err := os.Mkdir(run, 0o755); err != nil {
		return err
	}
	f.memPath = filepath.Join(dir, "memory.bin")
	f.vmState = filepath.Join(dir, "vm_state.bin")
	m, err := d.Boot(ctx, BootSpec{MemPath: f.memPath, Initrd: f.initrd, RuntimeDir: run})
	if err != nil {
		return err
	}
	ready := m.Ready()
	f.token = ready.Detail.Token
	f.digest = ready.Detail.Digest
	f.uptimeMS = ready.Detail.Uptime.Milliseconds()
	f.bootTime = ready.Ready.Sub(ready.Started)
	if len(f.token) != 32 {
		m.kill()
		return fmt.Errorf("agent token %q is not 32 hex digits", f.token)
	}
	if len(f.digest) != 16 {
		m.kill()
		return fmt.Errorf("agent digest %q is not 16 hex digits", f.digest)
	}
	if err := m.Capture(ctx, f.vmState); err != nil {
		return err
	}
	fi, err := os.Stat(f.vmState)
	if err != nil {
		return err
	}
	f.stateLen = fi.Size()
	return nil
}

// copyMemory gives a test its own copy of the captured memory file, as the
// memory device would serve it.
func (f *fixture) copyMemory(t testing.TB, dst string) {
	t.Helper()
	in, err := os.Open(f.memPath)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Sync(); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) spec(dir, memPath string) vmm.RestoreSpec {
	return vmm.RestoreSpec{
		SnapshotID:  "test",
		VMStatePath: f.vmState,
		Backend:     vmm.BackendFile,
		MemPath:     memPath,
		Layout:      layout.Single(DefaultMemoryMiB << 20),
		RuntimeDir:  dir,
	}
}

// restoreReady restores the fixture from memPath and checks that the agent
// answers with the token of the captured guest and, after walking its heap
// and re-reading its files on resume, with the digest the guest reported
// before the capture.
func restoreReady(t testing.TB, d *Driver, f *fixture, dir, memPath string) (*Machine, vmm.ReadyInfo) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
	defer cancel()
	m, err := d.RestoreMachine(ctx, f.spec(dir, memPath))
	if err != nil {
		t.Fatal(err)
	}
	info, err := m.WaitReady(ctx)
	if err != nil {
		m.kill()
		t.Fatal(err)
	}
	if got := info.Detail.Token; got != f.token {
		m.kill()
		t.Fatalf("restored agent answered with token %q, the captured guest drew %q", got, f.token)
	}
	if got := info.Detail.Digest; got != f.digest {
		m.kill()
		t.Fatalf("restored agent's state digest is %q, the captured guest's was %q", got, f.digest)
	}
	return m, info
}

// assertGone checks that QEMU pid (if known, else 0) has been reaped, that
// no process mentions dir on its command line and that dir holds no sockets.
func assertGone(t testing.TB, pid int, dir string) {
	t.Helper()
	if pid > 0 {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("qemu pid %d still exists (kill 0: %v)", pid, err)
		}
	}
	if procs := processesMentioning(dir); len(procs) > 0 {
		t.Errorf("processes still refer to %s: %v", dir, procs)
	}
	socks, _ := filepath.Glob(filepath.Join(dir, "*.sock"))
	if len(socks) > 0 {
		t.Errorf("sockets left behind: %v", socks)
	}
}

func processesMentioning(s string) []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return found
}

func TestRestoreResumesCapturedGuest(t *testing.T) {
	f := captured(t)
	d := requireQEMU(t)
	dir := t.TempDir()
	mem := filepath.Join(dir, "memory.bin")
	f.copyMemory(t, mem)

	m, info := restoreReady(t, d, f, dir, mem)
	uptime := info.Detail.Uptime.Milliseconds()
	if uptime <= 0 {
		t.Errorf("restored guest reported no uptime: %+v", info.Detail)
	}
	if uptime < f.uptimeMS {
		t.Errorf("restored guest's uptime %d ms is before the captured guest's %d ms", uptime, f.uptimeMS)
	}
	if !info.Started.Before(info.Ready) {
		t.Errorf("ready %v is not after start %v", info.Ready, info.Started)
	}
	t.Logf("boot to agent %v, vm state %d bytes; restore: start to ready %v, cont to ready %v",
		f.bootTime, f.stateLen, info.Ready.Sub(info.Started), info.Ready.Sub(m.resumed))

	pid := m.PID()
	if err := m.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(context.Background()); err != nil {
		t.Fatalf("wait after quit: %v", err)
	}
	assertGone(t, pid, dir)
}

func TestRestoreLeavesMemoryFileUnchanged(t *testing.T) {
	f := captured(t)
	d := requireQEMU(t)
	dir := t.TempDir()
	mem := filepath.Join(dir, "memory.bin")
	f.copyMemory(t, mem)
	before := fileSHA256(t, mem)
	for i := range 2 {
		run := filepath.Join(dir, fmt.Sprintf("run%d", i))
		if err := os.Mkdir(run, 0o755); err != nil {
			t.Fatal(err)
		}
		m, _ := restoreReady(t, d, f, run, mem)
		pid := m.PID()
		if err := m.RequestStop(); err != nil {
			t.Fatal(err)
		}
		if err := m.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		assertGone(t, pid, run)
	}
	if after := fileSHA256(t, mem); after != before {
		t.Fatalf("memory file changed across restores: sha256 %x, was %x", after, before)
	}
}

func fileSHA256(t testing.TB, path string) [sha256.Size]byte {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		t.Fatal(err)
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// TestWaitKillsGuestThatDoesNotStop: Wait without a stop request must give
// up after StopTimeout, kill QEMU and say so.
func TestWaitKillsGuestThatDoesNotStop(t *testing.T) {
	f := captured(t)
	requireQEMU(t)
	d, err := New(Options{StopTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mem := filepath.Join(dir, "memory.bin")
	f.copyMemory(t, mem)
	m, _ := restoreReady(t, d, f, dir, mem)
	pid := m.PID()
	if err := m.Wait(context.Background()); !errors.Is(err, ErrKilled) {
		t.Fatalf("Wait on a running guest returned %v, want ErrKilled", err)
	}
	assertGone(t, pid, dir)
}

// TestRestoreFailureLeavesNothing restores from a corrupt device state:
// QEMU rejects it, and the error must quote QEMU's log and leave no process
// or socket behind.
func TestRestoreFailureLeavesNothing(t *testing.T) {
	f := captured(t)
	d := requireQEMU(t)
	dir := t.TempDir()
	mem := filepath.Join(dir, "memory.bin")
	f.copyMemory(t, mem)
	bad := filepath.Join(dir, "vm_state.bin")
	// The header QEMU checks first is right, so QEMU starts and fails on
	// what follows (a wrong header is refused before: statefile_test.go).
	if err := os.WriteFile(bad, []byte("QEVM\x00\x00\x00\x03 but not really a migration stream"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := f.spec(dir, mem)
	spec.VMStatePath = bad
	ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
	defer cancel()
	m, err := d.RestoreMachine(ctx, spec)
	if err == nil {
		m.kill()
		t.Fatal("restore from a corrupt device state succeeded")
	}
	if !strings.Contains(err.Error(), "qemu log:") {
		t.Errorf("error does not quote QEMU's log: %v", err)
	}
	t.Logf("error: %v", err)
	assertGone(t, 0, dir) // no pid to check; the scan covers it
}

// TestBootCancelled: a boot whose context ends before the agent answers
// returns the context's error and leaves nothing behind.
func TestBootCancelled(t *testing.T) {
	d := requireQEMU(t)
	f := captured(t) // for the initramfs
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	// Cancel as soon as QEMU has started: its log file appears first.
	done := make(chan error, 1)
	go func() {
		_, err := d.Boot(ctx, BootSpec{MemPath: filepath.Join(dir, "memory.bin"), Initrd: f.initrd, RuntimeDir: dir})
		done <- err
	}()
	waitForFile(t, filepath.Join(dir, LogName), done)
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled boot returned %v, want context.Canceled", err)
	}
	assertGone(t, 0, dir)
}

// waitForFile blocks until path exists, using inotify on its directory.
func waitForFile(t *testing.T, path string, failed <-chan error) {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case err := <-failed:
			t.Fatalf("boot ended before QEMU started: %v", err)
		default:
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, int(restoreTimeout.Milliseconds())); err != nil && !errors.Is(err, unix.EINTR) {
			t.Fatal(err)
		}
		if pfd[0].Revents&unix.POLLIN != 0 {
			unix.Read(fd, buf)
		}
	}
}

// TestParentDeathKillsQEMU kills a process that has a restored guest
// running and checks that its QEMU dies with it.
func TestParentDeathKillsQEMU(t *testing.T) {
	f := captured(t)
	requireQEMU(t)
	dir := t.TempDir()
	mem := filepath.Join(dir, "memory.bin")
	f.copyMemory(t, mem)

	// Orphans are reparented to the nearest subreaper: make it this
	// process, so the dead child's QEMU can be reaped and checked here.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(reexec.Environ(os.Environ(), roleRestoringChild),
		"CHILD_VMSTATE="+f.vmState, "CHILD_MEM="+mem, "CHILD_DIR="+dir)
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		child.Process.Kill()
		child.Wait()
		t.Fatalf("child did not report its guest: %v", err)
	}
	var pid int
	if _, err := fmt.Sscanf(line, "READY %d", &pid); err != nil {
		child.Process.Kill()
		child.Wait()
		t.Fatalf("child said %q: %v", line, err)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		child.Process.Kill()
		child.Wait()
		t.Fatalf("open qemu pid %d: %v", pid, err)
	}
	defer unix.Close(pidfd)

	child.Process.Kill()
	child.Wait()

	// A pidfd becomes readable when its process exits.
	pfd := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 10_000)
	if err != nil || n == 0 {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("qemu pid %d outlived its parent (poll: %d, %v)", pid, n, err)
	}
	// A readable pidfd can come before the exit is waitable (a threaded
	// process's last threads are still being released), so the wait
	// blocks: it returns at once for a process that is already gone.
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatalf("wait for qemu pid %d, reparented to this process: %v", pid, err)
	}
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("qemu ended with %v, want killed by SIGKILL", ws)
	}
}

// runChild restores the guest named by the environment, reports QEMU's
// pid and waits to be killed.
func runChild() int {
	d, err := New(Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	spec := vmm.RestoreSpec{
		SnapshotID:  "child",
		VMStatePath: os.Getenv("CHILD_VMSTATE"),
		Backend:     vmm.BackendFile,
		MemPath:     os.Getenv("CHILD_MEM"),
		RuntimeDir:  os.Getenv("CHILD_DIR"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
	defer cancel()
	m, err := d.RestoreMachine(ctx, spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := m.WaitReady(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("READY %d\n", m.PID())
	io.Copy(io.Discard, os.Stdin) // until killed
	return 0
}

// TestKVMProbeBootsUnderTCG runs the accelerator probe's boot under TCG,
// which works everywhere QEMU does: it shows the probe recognises a
// kernel that boots, so a "no" for KVM is about KVM.
func TestKVMProbeBootsUnderTCG(t *testing.T) {
	d := requireQEMU(t)
	if testing.Short() {
		t.Skip("boots a kernel under TCG; skipped in -short mode")
	}
	kernel, err := d.Kernel()
	if err != nil {
		t.Fatal(err)
	}
	if !bootsToReset(context.Background(), d.opts.Binary, AccelTCG, kernel, bootTimeout) {
		t.Fatal("the probe kernel did not boot to its panic and reset under TCG")
	}
	accel, err := d.Accel(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("auto accelerator on this host: %s", accel)
}

func TestRestoreRejectsUffdBackend(t *testing.T) {
	d, err := New(Options{Binary: os.Args[0], Accel: AccelTCG})
	if err != nil {
		t.Fatal(err)
	}
	spec := vmm.RestoreSpec{Backend: vmm.BackendUffd, MemPath: "/nonexistent.sock", VMStatePath: "/nonexistent", RuntimeDir: t.TempDir()}
	if _, err := d.Restore(context.Background(), spec); !errors.Is(err, ErrUnsupportedBackend) {
		t.Fatalf("Restore with the Uffd backend returned %v, want ErrUnsupportedBackend", err)
	}
}

func TestRestoreRejectsOtherLayout(t *testing.T) {
	d, err := New(Options{Binary: os.Args[0], Accel: AccelTCG})
	if err != nil {
		t.Fatal(err)
	}
	spec := vmm.RestoreSpec{Backend: vmm.BackendFile, MemPath: "/nonexistent", VMStatePath: "/nonexistent",
		Layout: layout.Single(256 << 20), RuntimeDir: t.TempDir()}
	if _, err := d.Restore(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "layout") {
		t.Fatalf("Restore with a 256 MiB layout on a 128 MiB driver returned %v", err)
	}
}

func TestRestoreRejectsShortMemoryFile(t *testing.T) {
	d, err := New(Options{Binary: os.Args[0], Accel: AccelTCG})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mem := filepath.Join(dir, "memory.bin")
	if err := os.WriteFile(mem, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := vmm.RestoreSpec{Backend: vmm.BackendFile, MemPath: mem, VMStatePath: mem, RuntimeDir: dir}
	if _, err := d.Restore(context.Background(), spec); err == nil || !strings.Contains(err.Error(), "holds 4096 bytes") {
		t.Fatalf("Restore from a 4 KiB memory file returned %v", err)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	for name, opts := range map[string]Options{
		"accel":        {Binary: os.Args[0], Accel: "hvf"},
		"memory":       {Binary: os.Args[0], MemoryMiB: 8},
		"vcpus":        {Binary: os.Args[0], VCPUs: -1},
		"stop timeout": {Binary: os.Args[0], StopTimeout: -time.Second},
		"binary":       {Binary: "/nonexistent/qemu"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := New(opts); err == nil {
				t.Fatalf("New(%+v) accepted bad options", opts)
			}
		})
	}
}

// TestExitStatusOutlivesRuntimeDir: a guest that dies after ready is
// described from a goroutine that may run after its owner removed the
// runtime directory; the description still quotes QEMU's last words.
func TestExitStatusOutlivesRuntimeDir(t *testing.T) {
	f := captured(t)
	d := requireQEMU(t)
	dir := t.TempDir()
	mem := filepath.Join(dir, "memory.bin")
	f.copyMemory(t, mem)
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	m, _ := restoreReady(t, d, f, run, mem)
	const lastWords = "qemu-system-x86_64: terminating on a test's signal"
	log, err := os.OpenFile(m.LogPath(), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(log, lastWords)
	log.Close()
	m.kill()
	if err := os.RemoveAll(run); err != nil {
		t.Fatal(err)
	}
	if status := m.ExitStatus(); !strings.Contains(status, lastWords) {
		t.Fatalf("exit status %q lacks the log's last line %q", status, lastWords)
	}
}

// TestStateWrittenLivesInItsRestoreOnly: a restored guest's agent writes
// 16 MiB of state and reads it back with the digest the pattern predicts;
// a second restore of the same snapshot starts without it.
func TestStateWrittenLivesInItsRestoreOnly(t *testing.T) {
	f := captured(t)
	d := requireQEMU(t)
	dir := t.TempDir()
	mem := filepath.Join(dir, "memory.bin")
	f.copyMemory(t, mem)
	ctx, cancel := context.WithTimeout(context.Background(), restoreTimeout)
	defer cancel()
	const kib, seed = 16 << 10, 42
	want := agentspec.StateDigest(kib, seed)

	run := filepath.Join(dir, "first")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	m, _ := restoreReady(t, d, f, run, mem)
	start := time.Now()
	got, err := m.WriteState(ctx, "sandbox", kib, seed)
	if err != nil || got != want {
		m.kill()
		t.Fatalf("WriteState = %q, %v; want %q", got, err, want)
	}
	wrote := time.Since(start)
	state, err := m.State(ctx)
	if err != nil || len(state) != 1 || state["sandbox"] != want {
		m.kill()
		t.Fatalf("State = %v, %v; want sandbox=%s", state, err, want)
	}
	if _, err := m.WriteState(ctx, "huge", int64(DefaultMemoryMiB)<<10, 1); !errors.Is(err, vmm.ErrStateRefused) {
		t.Errorf("a buffer the size of the guest's memory: %v, want ErrStateRefused", err)
	}
	t.Logf("16 MiB of state written and read back in %v under TCG", wrote)
	if err := errors.Join(m.RequestStop(), m.Wait(context.Background())); err != nil {
		t.Fatal(err)
	}

	run = filepath.Join(dir, "second")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	m, _ = restoreReady(t, d, f, run, mem)
	defer func() {
		if err := errors.Join(m.RequestStop(), m.Wait(context.Background())); err != nil {
			t.Error(err)
		}
	}()
	if state, err := m.State(ctx); err != nil || len(state) != 0 {
		t.Fatalf("a second restore of the snapshot holds state %v (%v), want none", state, err)
	}
}
