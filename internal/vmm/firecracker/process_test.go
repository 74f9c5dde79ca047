package firecracker

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/vmm"
)

// newTestDriver returns a driver whose binary is a fake Firecracker.
func newTestDriver(t *testing.T, cfg fakeConfig, adjust func(*Options)) *Driver {
	t.Helper()
	opts := Options{
		Binary:       fakeBinary(t, cfg),
		EnvdAddress:  "unix:agent.sock",
		PollInterval: 5 * time.Millisecond,
		ReadyTimeout: 10 * time.Second,
		StopTimeout:  10 * time.Second,
	}
	if adjust != nil {
		adjust(&opts)
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// writeSnapshot writes the snapshot files a fake Firecracker reads, with
// the markers of a new token on pages.
func writeSnapshot(t *testing.T, memMiB int64, pages ...int64) (vmState, mem, token string) {
	t.Helper()
	token = rand.Text()
	vmState, mem = writeFakeSnapshot(t, t.TempDir(), memMiB, token, pages)
	return vmState, mem, token
}

func fileRestore(t *testing.T, memMiB int64) vmm.RestoreSpec {
	vmState, mem, _ := writeSnapshot(t, memMiB)
	return vmm.RestoreSpec{SnapshotID: "snap", VMStatePath: vmState, Backend: vmm.BackendFile, MemPath: mem, RuntimeDir: t.TempDir()}
}

// uffdRestore is fileRestore on the Uffd backend, served by a real
// handler in this process; the sessions it accepts come on the channel.
func uffdRestore(t *testing.T, memMiB int64) (vmm.RestoreSpec, <-chan *uffd.Session) {
	spec := fileRestore(t, memMiB)
	socket, sessions := serveUffd(t, spec.MemPath)
	spec.Backend, spec.MemPath = vmm.BackendUffd, socket
	return spec, sessions
}

// serveUffd serves the memory file mem to every VMM that connects to a
// handler socket in a new directory, as the uffd memory device does, until
// the test ends. It returns the socket and the sessions it accepted.
func serveUffd(t *testing.T, mem string) (string, <-chan *uffd.Session) {
	t.Helper()
	lower, err := memdev.File(mem).Open()
	if err != nil {
		t.Fatal(err)
	}
	h, err := uffd.Listen(filepath.Join(t.TempDir(), "uffd.sock"), lower, uffd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sessions := make(chan *uffd.Session, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			s, err := h.Accept(context.Background())
			if errors.Is(err, uffd.ErrClosed) {
				return
			}
			if err != nil {
				t.Errorf("uffd accept: %v", err)
				continue
			}
			sessions <- s
		}
	}()
	t.Cleanup(func() {
		h.Close()
		<-done
	})
	return h.SocketPath(), sessions
}

// requireGone checks that the fake that ran in runtimeDir has exited and
// left no API or vsock socket behind.
func requireGone(t *testing.T, runtimeDir string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(runtimeDir, "fake.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(data))
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("fake firecracker pid %d still exists (kill 0: %v)", pid, err)
	}
	for _, name := range []string{APISocketName, VsockSocketName} {
		if _, err := os.Stat(filepath.Join(runtimeDir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind (stat: %v)", name, err)
		}
	}
}

func TestRestoreReadyStop(t *testing.T) {
	ctx := testContext(t)
	record := filepath.Join(t.TempDir(), "requests.jsonl")
	d := newTestDriver(t, fakeConfig{Agent: true, RecordPath: record}, func(o *Options) { o.Vsock = true; o.LogLevel = "debug" })
	spec := fileRestore(t, 64)
	inst, err := d.Restore(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	m := inst.(*Machine)
	info, err := m.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Started.IsZero() || info.Ready.Before(info.Started) || !strings.HasPrefix(info.Detail.AgentAnswer, "ready ") ||
		info.Detail.PID != m.PID() || info.Detail.FirecrackerVersion != newestFakeVersion {
		t.Fatalf("ready info %+v", info)
	}
	// The release is asked first, and a load that does not want dirty
	// page tracking does not mention it.
	reqs := readRecords(t, record)
	if len(reqs) < 2 || reqs[0].Path != "/version" || reqs[1].Path != "/snapshot/load" {
		t.Fatalf("requests %+v, want GET /version then PUT /snapshot/load", reqs)
	}
	var load map[string]any
	if err := json.Unmarshal(reqs[1].Body, &load); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"track_dirty_pages", "enable_diff_snapshots"} {
		if _, ok := load[field]; ok {
			t.Errorf("load body %s carries %s, which was not wanted", reqs[1].Body, field)
		}
	}
	if _, exited := m.Exit(); exited {
		t.Fatal("Exit reports an exit while the VM runs")
	}
	if err := m.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	exit, ok := m.Exit()
	if !ok || exit.ExitCode != 0 || exit.Signal != 0 || exit.KillReason != KillNone || !exit.StopRequested {
		t.Fatalf("exit %+v", exit)
	}
	requireGone(t, spec.RuntimeDir)
	log, _ := os.ReadFile(filepath.Join(spec.RuntimeDir, LogFileName))
	for _, want := range []string{"level Debug, show-level true", "PUT /snapshot/load", "PUT /actions"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	// Stopping twice, or after the exit, is harmless.
	if err := m.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRestorePausedThenResume loads paused on both backends; on the Uffd
// backend the load's write of the generation ID faults through a real
// handler before the load answers, and the resumed guest finds the
// snapshot's bytes on the pages it reads.
func TestRestorePausedThenResume(t *testing.T) {
	touched := []int64{0, 3 << 20, 5<<20 + 4096}
	for _, backend := range []vmm.Backend{vmm.BackendFile, vmm.BackendUffd} {
		t.Run(string(backend), func(t *testing.T) {
			ctx := testContext(t)
			d := newTestDriver(t, fakeConfig{Agent: true, TouchPages: touched}, nil)
			vmState, mem, token := writeSnapshot(t, 16, touched...)
			spec := vmm.RestoreSpec{SnapshotID: "snap", VMStatePath: vmState, Backend: backend, MemPath: mem, RuntimeDir: t.TempDir(), Paused: true}
			if backend == vmm.BackendUffd {
				spec.MemPath, _ = serveUffd(t, mem)
			}
			inst, err := d.Restore(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			m := inst.(*Machine)
			defer func() {
				_ = m.RequestStop()
				_ = m.Wait(ctx)
			}()
			if info, err := m.Client().Describe(ctx); err != nil || info.State != "Paused" {
				t.Fatalf("restored with Paused: state %q (%v)", info.State, err)
			}
			resumer, ok := inst.(vmm.Resumer)
			if !ok {
				t.Fatal("a paused restore is not a vmm.Resumer")
			}
			if err := resumer.Resume(); err != nil {
				t.Fatal(err)
			}
			info, err := m.WaitReady(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got := info.Detail.AgentAnswer; !strings.HasSuffix(strings.TrimSpace(got), " token "+token) {
				t.Fatalf("agent answered %q; the snapshot holds token %s", got, token)
			}
		})
	}
}

func TestStopTimeoutKills(t *testing.T) {
	ctx := testContext(t)
	const stopTimeout = 300 * time.Millisecond
	d := newTestDriver(t, fakeConfig{Agent: true, IgnoreCtrlAltDel: true}, func(o *Options) { o.StopTimeout = stopTimeout })
	spec := fileRestore(t, 16)
	m := readyMachine(ctx, t, d, spec)
	start := time.Now()
	if err := m.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed < stopTimeout {
		t.Fatalf("killed after %v, before the stop timeout %v", elapsed, stopTimeout)
	}
	exit, _ := m.Exit()
	if exit.Signal != syscall.SIGKILL || exit.KillReason != KillStopTimeout || exit.ExitCode != -1 {
		t.Fatalf("exit %+v", exit)
	}
	requireGone(t, spec.RuntimeDir)
}

// TestStopPausedKillsAtOnce: Firecracker takes SendCtrlAltDel for a
// paused VM, whose guest cannot act on it until resumed; the driver kills
// such a VM at once instead of waiting out the stop timeout.
func TestStopPausedKillsAtOnce(t *testing.T) {
	ctx := testContext(t)
	// A stop timeout longer than the test's context: only the kill can
	// end the VM in time.
	d := newTestDriver(t, fakeConfig{Agent: true}, func(o *Options) { o.StopTimeout = time.Hour })
	runtimeDir := t.TempDir()
	m, err := d.Boot(ctx, BootSpec{RuntimeDir: runtimeDir, Kernel: "/vmlinux"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Pause(ctx); err != nil { // a paused guest cannot take SendCtrlAltDel
		t.Fatal(err)
	}
	if err := m.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if exit, _ := m.Exit(); exit.Signal != syscall.SIGKILL || exit.KillReason != KillStopNotRunning {
		t.Fatalf("exit %+v", exit)
	}
	requireGone(t, runtimeDir)
}

func TestStartFailureReportsLogTail(t *testing.T) {
	ctx := testContext(t)
	d := newTestDriver(t, fakeConfig{DieOnStart: true}, nil)
	spec := fileRestore(t, 16)
	_, err := d.Restore(ctx, spec)
	var exitErr *ExitError
	if !errors.Is(err, ErrExited) || !errors.As(err, &exitErr) {
		t.Fatalf("restore of a dying firecracker: %v, want an ExitError", err)
	}
	if exitErr.Info.ExitCode != 1 || exitErr.Info.KillReason != KillNone {
		t.Errorf("exit %+v", exitErr.Info)
	}
	for _, want := range []string{"kernel image is corrupt", "console: early panic", spec.SnapshotID} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	requireGone(t, spec.RuntimeDir)
}

func TestSocketTimeoutKills(t *testing.T) {
	ctx := testContext(t)
	// The timeout must leave a race-built child time to start and log its
	// first line even on a loaded host: the error is to quote that line.
	d := newTestDriver(t, fakeConfig{NoSocket: true}, func(o *Options) { o.StartTimeout = 2 * time.Second })
	spec := fileRestore(t, 16)
	_, err := d.Restore(ctx, spec)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "fake firecracker "+newestFakeVersion+" running") {
		t.Fatalf("restore with no API socket: %v", err)
	}
	requireGone(t, spec.RuntimeDir)
}

func TestLoadFailureKillsProcess(t *testing.T) {
	ctx := testContext(t)
	d := newTestDriver(t, fakeConfig{}, nil)
	spec := fileRestore(t, 16)
	spec.MemPath += ".missing"
	_, err := d.Restore(ctx, spec)
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.FaultMessage, "memory file") {
		t.Fatalf("restore with a missing memory file: %v", err)
	}
	if !strings.Contains(err.Error(), "PUT /snapshot/load") {
		t.Errorf("error lacks the log tail: %v", err)
	}
	requireGone(t, spec.RuntimeDir)
}

// TestLoadTimeoutKills: a load that never answers fails the restore once
// the load timeout has passed, and the process is killed.
func TestLoadTimeoutKills(t *testing.T) {
	const loadTimeout = 300 * time.Millisecond
	d := newTestDriver(t, fakeConfig{HangLoad: true}, func(o *Options) { o.LoadTimeout = loadTimeout })
	spec, _ := uffdRestore(t, 16)
	t0 := time.Now()
	_, err := d.Restore(testContext(t), spec)
	if !errors.Is(err, ErrLoadTimeout) || !strings.Contains(err.Error(), loadTimeout.String()) {
		t.Fatalf("restore whose load hangs: %v, want ErrLoadTimeout naming %v", err, loadTimeout)
	}
	if took := time.Since(t0); took < loadTimeout {
		t.Errorf("failed after %v, before the load timeout %v", took, loadTimeout)
	}
	requireGone(t, spec.RuntimeDir)
}

func TestRestoreCanceledDuringLoad(t *testing.T) {
	d := newTestDriver(t, fakeConfig{HangLoad: true}, nil)
	spec, accepted := uffdRestore(t, 16)
	ctx, cancel := context.WithCancel(testContext(t))
	go func() {
		<-accepted // Firecracker is inside the load
		cancel()
	}()
	_, err := d.Restore(ctx, spec)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled restore: %v", err)
	}
	requireGone(t, spec.RuntimeDir)
}

func TestHandlerDeathKillsVM(t *testing.T) {
	ctx := testContext(t)
	// No agent: only the handler's death can end WaitReady in time.
	d := newTestDriver(t, fakeConfig{}, func(o *Options) { o.ReadyTimeout = time.Hour })
	spec, accepted := uffdRestore(t, 16)
	handlerDone := make(chan struct{})
	m, err := d.RestoreMachine(ctx, spec, RestoreOptions{HandlerDone: handlerDone})
	if err != nil {
		t.Fatal(err)
	}
	<-accepted
	close(handlerDone)
	if _, err := m.WaitReady(ctx); !errors.Is(err, ErrHandlerDied) {
		t.Fatalf("WaitReady after the handler died: %v", err)
	}
	if err := m.Wait(ctx); !errors.Is(err, ErrHandlerDied) || !strings.Contains(err.Error(), "page-fault handler died") {
		t.Fatalf("Wait after the handler died: %v", err)
	}
	if exit, _ := m.Exit(); exit.Signal != syscall.SIGKILL || exit.KillReason != KillHandlerDied || exit.StopRequested {
		t.Fatalf("exit %+v", exit)
	}
	requireGone(t, spec.RuntimeDir)
}

func TestHandlerDeathDuringStop(t *testing.T) {
	ctx := testContext(t)
	d := newTestDriver(t, fakeConfig{Agent: true, IgnoreCtrlAltDel: true}, func(o *Options) { o.StopTimeout = time.Hour })
	spec, _ := uffdRestore(t, 16)
	handlerDone := make(chan struct{})
	m, err := d.RestoreMachine(ctx, spec, RestoreOptions{HandlerDone: handlerDone})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.RequestStop(); err != nil {
		t.Fatal(err)
	}
	close(handlerDone) // the guest ignores the stop; the handler going ends it
	if err := m.Wait(ctx); err != nil {
		t.Fatalf("a handler dying after RequestStop is part of the stop: %v", err)
	}
	if exit, _ := m.Exit(); exit.KillReason != KillHandlerDied || !exit.StopRequested {
		t.Fatalf("exit %+v", exit)
	}
}

func TestUnexpectedExit(t *testing.T) {
	ctx := testContext(t)
	d := newTestDriver(t, fakeConfig{}, func(o *Options) { o.ReadyTimeout = time.Hour })
	spec := fileRestore(t, 16)
	m, err := d.RestoreMachine(ctx, spec, RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(m.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, err = m.WaitReady(ctx)
	var exitErr *ExitError
	if !errors.As(err, &exitErr) || exitErr.Info.Signal != syscall.SIGKILL || exitErr.Info.KillReason != KillNone {
		t.Fatalf("WaitReady after the VM died: %v", err)
	}
	if !strings.Contains(err.Error(), "PUT /snapshot/load") {
		t.Errorf("error lacks the log tail: %v", err)
	}
	// A stop asked for after the death does not turn it into a stop.
	if err := m.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx); !errors.Is(err, ErrExited) {
		t.Fatalf("Wait after the VM died: %v", err)
	}
	requireGone(t, spec.RuntimeDir)
}

func TestFailedCaptureResumes(t *testing.T) {
	ctx := testContext(t)
	d := newTestDriver(t, fakeConfig{Agent: true}, nil)
	m, err := d.Boot(ctx, BootSpec{RuntimeDir: t.TempDir(), Kernel: "/vmlinux"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = m.RequestStop()
		_ = m.Wait(ctx)
	}()
	noDir := filepath.Join(t.TempDir(), "missing")
	_, err = m.Capture(ctx, CaptureSpec{VMStatePath: filepath.Join(noDir, "vm.state"), MemPath: filepath.Join(noDir, "mem")})
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Path != "/snapshot/create" {
		t.Fatalf("capture into a missing directory: %v", err)
	}
	info, err := m.Client().Describe(ctx)
	if err != nil || info.State != "Running" {
		t.Fatalf("after a failed capture the VM is %q (%v), want Running", info.State, err)
	}
}

// TestCaptureRejectsUnknownType: a snapshot type Firecracker does not have
// is refused before the VM is paused.
func TestCaptureRejectsUnknownType(t *testing.T) {
	ctx := testContext(t)
	d := newTestDriver(t, fakeConfig{Agent: true}, nil)
	m, err := d.Boot(ctx, BootSpec{RuntimeDir: t.TempDir(), Kernel: "/vmlinux"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = m.RequestStop()
		_ = m.Wait(ctx)
	}()
	dir := t.TempDir()
	_, err = m.Capture(ctx, CaptureSpec{VMStatePath: filepath.Join(dir, "vm.state"), MemPath: filepath.Join(dir, "mem"), Type: "Incremental"})
	if err == nil || !strings.Contains(err.Error(), `"Incremental"`) {
		t.Fatalf("capture of type Incremental: %v", err)
	}
	if info, err := m.Client().Describe(ctx); err != nil || info.State != "Running" {
		t.Fatalf("after a refused capture the VM is %q (%v), want Running", info.State, err)
	}
}

func TestWaitReadyAfterStop(t *testing.T) {
	ctx := testContext(t)
	d := newTestDriver(t, fakeConfig{}, func(o *Options) { o.ReadyTimeout = time.Hour })
	m, err := d.RestoreMachine(ctx, fileRestore(t, 16), RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.WaitReady(ctx); !errors.Is(err, ErrStopped) {
		t.Fatalf("WaitReady of a stopped VM: %v", err)
	}
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestOptionsRejected(t *testing.T) {
	for _, c := range []struct {
		name string
		opts Options
		want string
	}{
		{"no binary", Options{}, "binary"},
		{"bad level", Options{Binary: "fc", LogLevel: "Loud"}, "log level"},
		{"negative timeout", Options{Binary: "fc", StopTimeout: -time.Second}, "stop timeout"},
		{"bad address", Options{Binary: "fc", EnvdAddress: "tcp://x"}, "envd address"},
		{"vsock without device", Options{Binary: "fc", EnvdAddress: "vsock:49983"}, "vsock option"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.opts)
			if !errors.Is(err, ErrInvalidOptions) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want an ErrInvalidOptions naming %q", err, c.want)
			}
		})
	}
	d, err := New(Options{Binary: "fc"})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Options(); got.StopTimeout != DefaultStopTimeout || got.LogLevel != DefaultLogLevel || got.PollInterval != DefaultPollInterval {
		t.Fatalf("defaults not applied: %+v", got)
	}
	ctx := testContext(t)
	if _, err := d.Restore(ctx, vmm.RestoreSpec{RuntimeDir: t.TempDir(), VMStatePath: "s", MemPath: "m", Backend: "Disk"}); err == nil || !strings.Contains(err.Error(), "Disk") {
		t.Fatalf("restore with an unknown backend: %v", err)
	}
	if _, err := d.Boot(ctx, BootSpec{RuntimeDir: t.TempDir(), Kernel: "k", VCPUs: 33}); err == nil || !strings.Contains(err.Error(), "vcpu") {
		t.Fatalf("boot with 33 vCPUs: %v", err)
	}
}

func TestInstanceID(t *testing.T) {
	for in, want := range map[string]string{
		"/run/warmstart/restore-01":     "restore-01",
		"/tmp/a b_c.d":                  "a-b-c-d",
		"/":                             "warmstart",
		"/x/" + strings.Repeat("z", 80): strings.Repeat("z", 64),
	} {
		if got := instanceID(in); got != want {
			t.Errorf("instanceID(%q) = %q, want %q", in, got, want)
		}
	}
}
