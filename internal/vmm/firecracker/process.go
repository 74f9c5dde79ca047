package firecracker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Files inside a VM's runtime directory.
const (
	// APISocketName is Firecracker's API socket (--api-sock).
	APISocketName = "firecracker.sock"
	// LogFileName is Firecracker's own log (--log-path).
	LogFileName = "firecracker.log"
	// ConsoleFileName receives Firecracker's stdout and stderr: the guest's
	// serial console, and errors printed before the logger is set up.
	ConsoleFileName = "firecracker.out"
	// VsockSocketName backs the VM's vsock device.
	VsockSocketName = "vsock.sock"
)

const (
	// socketPollInterval separates attempts to connect to a starting
	// Firecracker's API socket; it binds within milliseconds.
	socketPollInterval = 5 * time.Millisecond
	// maxSocketPathBytes: sun_path holds 108 bytes including the NUL.
	maxSocketPathBytes = 107
	logTailBytes       = 2048
	logTailLines       = 8
	// maxInstanceIDBytes is the longest --id Firecracker accepts.
	maxInstanceIDBytes = 64
)

// KillReason says why the driver sent SIGKILL to a Firecracker process.
type KillReason string

// Kill reasons.
const (
	KillNone        KillReason = ""
	KillStopTimeout KillReason = "the guest did not shut down within the stop timeout"
	KillStopRefused KillReason = "SendCtrlAltDel failed"
	KillHandlerDied KillReason = "the page-fault handler died"
	KillStartFailed KillReason = "the VM failed to start"
	KillCaptured    KillReason = "stopped after capture"
	KillCanceled    KillReason = "canceled"

	// KillStopNotRunning: the VM was paused (or not yet running) when
	// asked to stop, so its guest could not act on SendCtrlAltDel.
	KillStopNotRunning KillReason = "the VM was not running when asked to stop"
)

// ExitInfo is how a Firecracker process ended.
type ExitInfo struct {
	PID int
	// ExitCode is the process's exit status, -1 when a signal ended it.
	ExitCode int
	// Signal is the signal that ended the process, 0 when it exited.
	Signal syscall.Signal
	// KillReason is set when a SIGKILL the driver sent ended the process.
	KillReason KillReason
	// StopRequested reports whether RequestStop was called before the exit.
	StopRequested bool
}

func (e ExitInfo) String() string {
	s := fmt.Sprintf("pid %d exit status %d", e.PID, e.ExitCode)
	if e.Signal != 0 {
		s = fmt.Sprintf("pid %d killed by %v", e.PID, e.Signal)
	}
	if e.KillReason != KillNone {
		s += " (sent by warmstart: " + string(e.KillReason) + ")"
	}
	return s
}

// ExitError reports a Firecracker process that exited without being asked
// to, with the tail of its log and console output.
type ExitError struct {
	Info    ExitInfo
	LogTail string
}

func (e *ExitError) Error() string {
	s := fmt.Sprintf("%v: %v", ErrExited, e.Info)
	if e.LogTail != "" {
		s += "; " + e.LogTail
	}
	return s
}

func (e *ExitError) Unwrap() error { return ErrExited }

// process is one running Firecracker binary and the files it owns in its
// runtime directory.
type process struct {
	cmd        *exec.Cmd
	runtimeDir string
	apiSocket  string
	// exited is closed once the process has been reaped; state and
	// exitTail are set before.
	exited chan struct{}
	state  *os.ProcessState
	// exitTail is logTail as the process left its files: they are in the
	// runtime directory, which its owner may remove before the exit is
	// described.
	exitTail string

	mu         sync.Mutex
	killReason KillReason
	killTimer  *time.Timer
}

// startProcess spawns Firecracker with its API socket, log and console in
// runtimeDir. staleSockets are other sockets the VM will bind there, removed
// first as the API socket is: Firecracker refuses to bind an existing path,
// and a crashed predecessor leaves them behind.
//
// The command line uses Firecracker's own flags: --api-sock (the socket it
// binds), --id (the instance id in its log lines; alphanumerics and '-',
// at most 64), --log-path (an existing file or FIFO), --level (Error,
// Warning, Info, Debug, Trace, Off) and --show-level (prefix lines with
// the level). Seccomp stays at its default, on.
func startProcess(opts Options, runtimeDir string, staleSockets ...string) (*process, error) {
	if runtimeDir == "" {
		return nil, errors.New("start firecracker: runtime directory is empty")
	}
	apiSocket := filepath.Join(runtimeDir, APISocketName)
	for _, s := range append([]string{apiSocket}, staleSockets...) {
		if len(s) > maxSocketPathBytes {
			return nil, fmt.Errorf("start firecracker: socket path %s is longer than %d bytes", s, maxSocketPathBytes)
		}
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("start firecracker: remove stale socket: %w", err)
		}
	}
	logPath := filepath.Join(runtimeDir, LogFileName)
	// Firecracker opens --log-path without creating it.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("start firecracker: %w", err)
	}
	if err := logFile.Close(); err != nil {
		return nil, fmt.Errorf("start firecracker: %w", err)
	}
	console, err := os.OpenFile(filepath.Join(runtimeDir, ConsoleFileName), os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("start firecracker: %w", err)
	}
	defer console.Close()

	cmd := exec.Command(opts.Binary,
		"--api-sock", apiSocket,
		"--id", instanceID(runtimeDir),
		"--log-path", logPath,
		"--level", opts.LogLevel,
		"--show-level",
	)
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// The VM must not outlive warmstart: its memory device dies with us.
		Pdeathsig: syscall.SIGKILL,
		// A terminal's Ctrl-C goes to the foreground process group; the
		// VM is stopped by warmstart's shutdown order, not by that signal.
		Setpgid: true,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start firecracker %s: %w", opts.Binary, err)
	}
	p := &process{cmd: cmd, runtimeDir: runtimeDir, apiSocket: apiSocket, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the status is read from ProcessState
		p.state = cmd.ProcessState
		p.exitTail = p.readLogTail()
		p.mu.Lock()
		if p.killTimer != nil {
			p.killTimer.Stop()
		}
		p.mu.Unlock()
		close(p.exited)
	}()
	return p, nil
}

// instanceID derives Firecracker's --id (alphanumerics and '-', at most 64)
// from the runtime directory's name, so logs can be matched to instances.
func instanceID(runtimeDir string) string {
	id := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-':
			return r
		default:
			return '-'
		}
	}, filepath.Base(runtimeDir))
	id = strings.Trim(id, "-")
	if len(id) > maxInstanceIDBytes {
		id = id[len(id)-maxInstanceIDBytes:]
	}
	if id == "" {
		return "warmstart"
	}
	return id
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// waitForSocket returns once the API socket accepts a connection. It fails
// as soon as the process exits, with the tail of its output.
func (p *process) waitForSocket(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(socketPollInterval)
	defer tick.Stop()
	var lastErr error
	for {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", p.apiSocket)
		if err == nil {
			return conn.Close()
		}
		lastErr = err
		select {
		case <-p.exited:
			return fmt.Errorf("firecracker exited before its API socket accepted: %w", p.exitError())
		case <-ctx.Done():
			return fmt.Errorf("wait for firecracker API socket %s: %w (last attempt: %v); %s", p.apiSocket, ctx.Err(), lastErr, p.logTail())
		case <-tick.C:
		}
	}
}

// kill sends SIGKILL and records why, unless the process is already gone.
func (p *process) kill(reason KillReason) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err == nil && p.killReason == KillNone {
		p.killReason = reason
	}
}

// killAfter arms a timer that kills the process after d unless it exits.
func (p *process) killAfter(d time.Duration, reason KillReason) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killTimer == nil {
		p.killTimer = time.AfterFunc(d, func() { p.kill(reason) })
	}
}

// exitInfo describes the exit; valid once exited is closed. A kill that
// found the process already exiting (signalled before it was reaped) did
// not end it, so its reason is dropped.
func (p *process) exitInfo() ExitInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	info := ExitInfo{PID: p.pid(), ExitCode: -1, KillReason: p.killReason}
	if p.state != nil {
		info.ExitCode = p.state.ExitCode()
		if ws, ok := p.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			info.Signal = ws.Signal()
		}
		if info.Signal != syscall.SIGKILL {
			info.KillReason = KillNone
		}
	}
	return info
}

// exitError is the ExitError of an exited process.
func (p *process) exitError() *ExitError {
	return &ExitError{Info: p.exitInfo(), LogTail: p.logTail()}
}

// logTail returns the last lines of Firecracker's log and console output,
// for error messages: once the process has exited, as they were then.
func (p *process) logTail() string {
	select {
	case <-p.exited:
		return p.exitTail
	default:
		return p.readLogTail()
	}
}

// readLogTail reads the last lines of the log and console files.
func (p *process) readLogTail() string {
	var parts []string
	for _, name := range []string{LogFileName, ConsoleFileName} {
		if t := fileTail(filepath.Join(p.runtimeDir, name)); t != "" {
			parts = append(parts, fmt.Sprintf("%s: %q", name, t))
		}
	}
	if len(parts) == 0 {
		return "no log output"
	}
	return strings.Join(parts, "; ")
}

// fileTail returns the last logTailLines lines of the file's last
// logTailBytes bytes, or "" when it is empty or unreadable.
func fileTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-logTailBytes, 0)
	buf, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimSpace(buf), []byte("\n"))
	if off > 0 && len(lines) > 1 {
		lines = lines[1:] // the first line is cut
	}
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// removeSockets deletes the sockets the process bound; Firecracker leaves
// them behind when it exits.
func (p *process) removeSockets(extra ...string) error {
	var errs []error
	for _, s := range append([]string{p.apiSocket}, extra...) {
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
