package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"warmstart/internal/vmm"
)

// Files a Machine keeps in its runtime directory.
const (
	QMPSocketName    = "qmp.sock"
	SerialSocketName = "serial.sock"
	LogName          = "qemu.log"
)

// maxSocketPathBytes is the room for a path in sockaddr_un, less its NUL.
const maxSocketPathBytes = 107

// logTailBytes is how much of QEMU's log an error quotes.
const logTailBytes = 2048

// quitTimeout bounds the QMP quit RequestStop sends before it falls back
// to SIGTERM.
const quitTimeout = time.Second

// Machine is one running QEMU guest, booted or restored.
type Machine struct {
	opts    Options
	dir     string
	logPath string
	sockets []string
	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{} // closed once QEMU has been reaped
	exitErr error         // QEMU's exit status; read after exited closes
	// exitLogTail is the tail of QEMU's log as it exited, read before
	// exited closes: the log lives in the runtime directory, which its
	// owner may remove before the exit is described.
	exitLogTail string
	mon         *monitor
	agent       *agentConn
	capturable  bool
	// pausable: restored with guest memory shared over a writable view
	// (vmm.RestoreSpec.Pausable), so Pause and SaveDiff may run.
	pausable bool
	// memPath is a booted guest's memory file, its RAM from boot.
	memPath string

	// resumed is when the guest last started running; only agent answers
	// to pings sent after it count as ready.
	resumed time.Time

	readyMu sync.Mutex
	ready   vmm.ReadyInfo

	closeOnce sync.Once
}

var (
	_ vmm.VM           = (*Machine)(nil)
	_ vmm.ExitReporter = (*Machine)(nil)
)

// TCGICount runs TCG guests with virtual time counted in instructions
// (one nanosecond each) rather than read from the host clock; idle time
// still follows the host clock (sleep=on). Without it the guest kernel
// calibrates its TSC against the emulated PIT in host time, and on a
// loaded host, where the emulating thread is descheduled mid-calibration,
// calibration fails and the 6.1 kernel hangs right after "Marking TSC
// unstable". With instruction-counted time calibration cannot fail, and
// the guest runs the same instructions to readiness whatever the host's
// load. The price, measured here: boot to agent about 11.5 s instead of
// about 7.5 s; restores are not measurably slower. It also makes TCG run
// all vCPUs on one host thread.
const TCGICount = "shift=0,sleep=on"

// machineArgs are the arguments shared by every QEMU the driver starts:
// a machine with no default devices, which exits instead of resetting (a
// guest panic with reboot=t ends QEMU); a microvm without firmware option
// ROMs, a PC with its generation ID device.
func machineArgs(accel, machine string, memoryMiB, vcpus int) []string {
	args := []string{"-M", "microvm,x-option-roms=off,rtc=on"}
	if machine == MachinePC {
		args = []string{"-M", "pc", "-device", vmgenidDevice}
	}
	args = append(args, "-accel", accel)
	if accel == AccelKVM {
		args = append(args, "-cpu", "host")
	} else {
		args = append(args, "-cpu", "max", "-icount", TCGICount)
	}
	return append(args,
		"-m", strconv.Itoa(memoryMiB)+"M",
		"-smp", strconv.Itoa(vcpus),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
	)
}

// memoryArgs back guest RAM with the file at path, shared (the guest's
// writes land in the file) or private (MAP_PRIVATE, the file is only read).
func memoryArgs(memoryMiB int, path string, share bool) []string {
	onOff := "off"
	if share {
		onOff = "on"
	}
	return []string{
		"-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s", memoryMiB, optionValue(path), onOff),
		"-machine", "memory-backend=mem",
	}
}

// optionValue escapes a value for QEMU's comma-separated option syntax.
func optionValue(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// start launches QEMU with args plus the monitor and serial sockets in dir,
// and connects to both. The sockets are created and listening before QEMU
// starts and are handed to it as file descriptors, so there is no window in
// which the driver must wait for QEMU to create them.
func (d *Driver) start(ctx context.Context, dir string, args []string) (m *Machine, err error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("runtime directory %s: not a directory (%v)", dir, err)
	}
	m = &Machine{
		opts:    d.opts,
		dir:     dir,
		logPath: filepath.Join(dir, LogName),
		exited:  make(chan struct{}),
	}
	qmpPath := filepath.Join(dir, QMPSocketName)
	serialPath := filepath.Join(dir, SerialSocketName)
	inherited, err := m.listenSockets(qmpPath, serialPath)
	defer func() {
		for _, f := range inherited {
			f.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		m.removeSockets()
		return nil, fmt.Errorf("create qemu log: %w", err)
	}
	defer logFile.Close()
	m.cmd = d.command(args, logFile, inherited)
	m.started = time.Now()
	if err := m.cmd.Start(); err != nil {
		m.removeSockets()
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	go func() {
		m.exitErr = m.cmd.Wait()
		m.exitLogTail = readTail(m.logPath, logTailBytes)
		close(m.exited)
	}()
	defer func() {
		if err != nil {
			m.kill()
			err = m.withLog(err)
			m = nil
		}
	}()

	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", serialPath)
	if err != nil {
		return m, fmt.Errorf("connect serial console: %w", err)
	}
	m.agent = newAgentConn(conn, !d.withoutGuestEntropy)
	if m.mon, err = dialMonitor(ctx, qmpPath, m.exited); err != nil {
		return m, err
	}
	return m, nil
}

// listenSockets creates the listening sockets at paths, in order, and
// returns them as the files QEMU inherits; on failure none is left.
func (m *Machine) listenSockets(paths ...string) ([]*os.File, error) {
	var files []*os.File
	for _, p := range paths {
		f, err := listenUnix(p)
		if err != nil {
			m.removeSockets()
			return files, err
		}
		m.sockets = append(m.sockets, p)
		files = append(files, f)
	}
	return files, nil
}

// command is the QEMU process of args, with the monitor and the serial
// console on the inherited sockets (descriptors 3 and 4) and its output
// in logFile, where the command line is written first.
func (d *Driver) command(args []string, logFile *os.File, inherited []*os.File) *exec.Cmd {
	// ExtraFiles[i] becomes descriptor 3+i in QEMU.
	args = append(args,
		"-chardev", "socket,id=qmp,fd=3,server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
		"-chardev", "socket,id=serial0,fd=4,server=on,wait=off",
		"-serial", "chardev:serial0",
	)
	var cmd *exec.Cmd
	if d.opts.KeepHugePageAdvice {
		cmd = exec.Command(d.opts.Binary, args...)
	} else {
		path, argv, env := launcherCommand(d.opts.Binary, args)
		cmd = exec.Command(path)
		cmd.Args, cmd.Env = argv, env
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.ExtraFiles = inherited
	// Pdeathsig fires when the thread that forked QEMU dies; Go keeps its
	// threads for the life of the process unless a locked goroutine exits,
	// and no caller starts machines from one.
	// Its own process group: a terminal's Ctrl-C goes to the foreground
	// group, and QEMU ends itself on SIGINT; the VM is stopped by
	// warmstart's shutdown order, not by that signal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	fmt.Fprintf(logFile, "+ %s %s\n", d.opts.Binary, strings.Join(args, " "))
	return cmd
}

// listenUnix creates a listening Unix socket at path and returns it as a
// file to hand to QEMU. The socket file stays until removeSockets.
func listenUnix(path string) (*os.File, error) {
	if len(path) > maxSocketPathBytes {
		return nil, fmt.Errorf("socket path %s is %d bytes, longer than the %d a Unix socket allows: use a shorter runtime directory", path, len(path), maxSocketPathBytes)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	l.Close()
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return f, nil
}

// PID is QEMU's process id.
func (m *Machine) PID() int { return m.cmd.Process.Pid }

// LogPath is the file holding QEMU's output.
func (m *Machine) LogPath() string { return m.logPath }

// Exited is closed once QEMU has exited and been reaped.
func (m *Machine) Exited() <-chan struct{} { return m.exited }

// ExitStatus tells how QEMU ended, with the tail of its log and the
// guest's last console lines; empty while it runs.
func (m *Machine) ExitStatus() string {
	if err := m.exitError(); err != nil {
		return m.withLog(err).Error()
	}
	return ""
}

// ProcessExit is how QEMU ended, once Exited has closed.
func (m *Machine) ProcessExit() vmm.ProcessExit {
	select {
	case <-m.exited: // cmd.Wait has set ProcessState
		return vmm.ProcessExitOf(m.cmd.ProcessState)
	default:
		return vmm.ProcessExit{}
	}
}

// Resumed is when the guest last started running: QEMU's start for a
// boot, the return of cont for a restore.
func (m *Machine) Resumed() time.Time { return m.resumed }

// Ready returns what the last successful WaitReady learned.
func (m *Machine) Ready() vmm.ReadyInfo {
	m.readyMu.Lock()
	defer m.readyMu.Unlock()
	return m.ready
}

// WaitReady pings the agent until it answers a ping sent after the guest
// was last started or continued. Detail carries the agent's "token", its
// guest "uptime_ms", the "digest" of its memory state after the resume work
// it does before its first answer to a new connection, the "guest_random"
// bytes it drew from the guest's RNG after reseeding it and how that
// "reseed" went (absent from agents that predate them; see
// cmd/warmstart-agent), and QEMU's "pid" (for callers that check no VMM
// outlives its stop). A guest that says it could not reseed its RNG from
// the host's entropy is not ready: it would share its RNG state with every
// other restore of the snapshot. WaitReady may be called again to ping a
// ready guest.
func (m *Machine) WaitReady(ctx context.Context) (vmm.ReadyInfo, error) {
	p, err := m.agent.ping(ctx, m.exited)
	if err != nil {
		return vmm.ReadyInfo{}, m.withLog(fmt.Errorf("wait for guest agent: %w", err))
	}
	if p.reseed == reseedFailed {
		return vmm.ReadyInfo{}, m.withLog(fmt.Errorf("wait for guest agent: %w", ErrGuestNotReseeded))
	}
	info := vmm.ReadyInfo{
		Started: m.started,
		Ready:   p.at,
		Detail: vmm.ReadyDetail{
			Token: p.token, Uptime: p.uptime, PID: m.PID(),
			Digest: p.digest, GuestRandom: p.random, Reseed: p.reseed,
		},
	}
	m.readyMu.Lock()
	m.ready = info
	m.readyMu.Unlock()
	return info, nil
}

// RequestStop asks QEMU to quit over QMP and, if that fails, sends it
// SIGTERM. It does not wait; Wait does.
func (m *Machine) RequestStop() error {
	select {
	case <-m.exited:
		return nil
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(quitTimeout, m.opts.StopTimeout))
	defer cancel()
	if err := m.mon.execute(ctx, "quit", nil, nil); err == nil {
		return nil
	}
	// QEMU may close the monitor before its answer to quit arrives.
	select {
	case <-m.exited:
		return nil
	default:
	}
	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop qemu %d: %w", m.PID(), err)
	}
	return nil
}

// Wait waits up to StopTimeout for QEMU to exit, kills it if it has not,
// and releases the machine's connections and sockets. It returns ErrKilled
// (or the context's error) if QEMU had to be killed; QEMU is gone either way.
func (m *Machine) Wait(ctx context.Context) error {
	timer := time.NewTimer(m.opts.StopTimeout)
	defer timer.Stop()
	var err error
	select {
	case <-m.exited:
	case <-timer.C:
		m.kill()
		err = fmt.Errorf("%w: pid %d did not exit within %v", ErrKilled, m.PID(), m.opts.StopTimeout)
	case <-ctx.Done():
		m.kill()
		err = fmt.Errorf("%w: pid %d: %w", ErrKilled, m.PID(), ctx.Err())
	}
	m.close()
	return err
}

// stop asks QEMU to quit and waits for it; used where the machine has
// served its purpose (after a capture).
func (m *Machine) stop(ctx context.Context) error {
	if err := m.RequestStop(); err != nil {
		m.kill()
		m.close()
		return err
	}
	return m.Wait(ctx)
}

// kill ends QEMU at once and waits until it is reaped, then releases the
// machine's connections and sockets.
func (m *Machine) kill() {
	// Kill fails only for a process already reaped.
	_ = m.cmd.Process.Kill()
	<-m.exited
	m.close()
}

// close releases the connections and socket files. QEMU must have exited
// or be about to.
func (m *Machine) close() {
	m.closeOnce.Do(func() {
		if m.mon != nil {
			m.mon.close()
		}
		if m.agent != nil {
			m.agent.close()
		}
		m.removeSockets()
	})
}

func (m *Machine) removeSockets() {
	for _, p := range m.sockets {
		os.Remove(p)
	}
}

// exitError describes how QEMU ended, once it has.
func (m *Machine) exitError() error {
	select {
	case <-m.exited:
	default:
		return nil
	}
	if m.exitErr != nil {
		return fmt.Errorf("%w: %v", ErrExited, m.exitErr)
	}
	return fmt.Errorf("%w: status 0", ErrExited)
}

// withLog adds the tail of QEMU's log and the guest's recent console lines
// to err.
func (m *Machine) withLog(err error) error {
	var extra []string
	if exitErr := m.exitError(); exitErr != nil && !errors.Is(err, ErrExited) {
		extra = append(extra, exitErr.Error())
	}
	if tail := m.logTail(); tail != "" {
		extra = append(extra, "qemu log: "+tail)
	}
	if m.agent != nil {
		if lines := m.agent.recentLines(); len(lines) > 0 {
			extra = append(extra, "guest console: "+strings.Join(lines, " | "))
		}
	}
	if len(extra) == 0 {
		return err
	}
	return fmt.Errorf("%w [%s]", err, strings.Join(extra, "; "))
}

// logTail is the tail of QEMU's log: as it exited, once it has.
func (m *Machine) logTail() string {
	select {
	case <-m.exited:
		return m.exitLogTail
	default:
		return readTail(m.logPath, logTailBytes)
	}
}

// readTail returns up to n bytes from the end of the file at path, on one
// line, without a first line cut in the middle and without the command
// line the driver logs first (lines starting "+ ").
func readTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-n, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return ""
	}
	s := string(b)
	if off > 0 {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	var lines []string
	for _, line := range strings.Split(s, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "+ ") {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, " | ")
}
