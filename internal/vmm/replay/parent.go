package replay

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"warmstart/internal/reexec"
	"warmstart/internal/vmm"
)

// LogFile is the name of the child's output log in RestoreSpec.RuntimeDir.
const LogFile = "replay-vmm.log"

// outputTailBytes is how much of the child's latest output is kept for
// errors, and outputQuoteBytes how much of it they quote: the last whole
// lines that fit.
const (
	outputTailBytes  = 4096
	outputQuoteBytes = 2048
)

// ErrExited is wrapped by the error WaitReady returns when the replay VMM
// exits (or is killed) before reporting ready.
var ErrExited = errors.New("replay vmm exited")

// ErrNotReady is wrapped by the error WaitReady returns when the replay VMM
// has not reported ready within VMM.ReadyTimeout.
var ErrNotReady = errors.New("replay vmm not ready in time")

// VMM restores snapshots by starting a replay VMM process per restore.
type VMM struct {
	// Exe is the executable to run as the VMM; empty means this process's
	// own executable. It must dispatch RoleReplayVMM (internal/reexec) first thing.
	Exe string
	// TracePath is the startup trace each restore plays.
	TracePath string
	// Remove lists ranges to drop and touch again after the trace; it needs
	// the Uffd backend.
	Remove []Range
	// Output, when set, also receives the child's standard output and error.
	Output io.Writer
	// ReadyTimeout bounds WaitReady, as [agent] timeout bounds a real
	// guest's: a VMM stuck on memory that never comes fails the restore
	// rather than holding it for ever. Zero means no bound.
	ReadyTimeout time.Duration
	// StopTimeout is how long a VMM asked to stop may take to exit before
	// it is killed, as Firecracker's and QEMU's drivers bound theirs.
	// Zero or less means DefaultStopTimeout.
	StopTimeout time.Duration
	// WriteStamp is Config.WriteStamp for every restore: written pages
	// change, so a pausable restore has pages to save.
	WriteStamp uint64
}

// DefaultStopTimeout is the stop bound of a VMM that sets none: a replay
// VMM exits within milliseconds of its stop, so one still running after
// this is hung (stopped by a signal, stuck on its memory).
const DefaultStopTimeout = 5 * time.Second

var (
	_ vmm.VMM     = (*VMM)(nil)
	_ vmm.VM      = (*VM)(nil)
	_ vmm.Resumer = (*VM)(nil)
	_ vmm.Exiter  = (*VM)(nil)

	_ vmm.ExitReporter = (*VM)(nil)
)

// Report is what the replay VMM reported when it became ready.
type Report struct {
	// SHA256 is the hex SHA-256 over the bytes it read (see the package
	// comment); ExpectedHash computes the value a correct device yields.
	SHA256 string
	// Start is when it began mapping memory, FirstTouch just before its
	// first page touch, Ready when its last touch returned.
	Start, FirstTouch, Ready time.Time
	// TouchedPages is the number of distinct trace pages touched;
	// RemovedPages the number of pages touched again after removal.
	TouchedPages, RemovedPages int
}

// VM is one running replay VMM.
type VM struct {
	cmd     *exec.Cmd
	stdin   *os.File
	logPath string
	output  *tailBuffer

	paused       bool          // restored with RestoreSpec.Paused
	readyTimeout time.Duration // VMM.ReadyTimeout
	stopTimeout  time.Duration // VMM.StopTimeout, or its default
	held         chan struct{} // closed when the paused event arrives
	ready        chan struct{} // closed when the ready event arrives
	exited       chan struct{} // closed when the process is reaped and its control channel drained

	// extraOutput also receives the child's output (VMM.Output).
	extraOutput io.Writer

	stdinMu  sync.Mutex // orders commands against the close that stops
	resumed  bool
	stopSent bool

	// replies carries the answers to pause commands (pause.go); frozen is
	// set between Pause and Resume; vmStatePath is the restored state.
	reqMu       sync.Mutex
	replies     chan event
	frozen      bool
	vmStatePath string

	mu         sync.Mutex
	report     Report
	childError string // the child's error event
	killReason string
	waitErr    error
}

// Restore starts a replay VMM for spec and returns at once; WaitReady waits
// for it. ctx bounds the restore: if it ends before the VMM reports ready,
// the VMM is killed. Once ready, the instance outlives ctx.
func (v *VMM) Restore(ctx context.Context, spec vmm.RestoreSpec) (vmm.VM, error) {
	return v.Start(ctx, spec)
}

// Start is Restore returning the concrete instance.
func (v *VMM) Start(ctx context.Context, spec vmm.RestoreSpec) (*VM, error) {
	if spec.VMStatePath != "" {
		// A restore of memory alone (the driver's own tests) names no state.
		if err := v.CheckState(spec.VMStatePath); err != nil {
			return nil, fmt.Errorf("replay vmm %s: %w", spec.SnapshotID, err)
		}
	}
	exe, raw, err := v.child(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("replay vmm %s: %w", spec.SnapshotID, err)
	}
	inst := v.newVM(spec)
	f, err := inst.openFiles(spec)
	if err != nil {
		return nil, fmt.Errorf("replay vmm %s: %w", spec.SnapshotID, err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(reexec.Environ(withoutChildEnv(os.Environ()), RoleReplayVMM), ConfigEnv+"="+string(raw))
	cmd.Stdin = f.stdinR
	cmd.Stdout, cmd.Stderr = f.output, f.output
	cmd.ExtraFiles = []*os.File{f.controlW}
	// The child is killed if the thread that started it dies; that thread
	// stays locked and alive in the goroutine of run until the child is
	// reaped, so this fires only when this process dies. Its own process
	// group: a terminal's Ctrl-C goes to the foreground group, and the
	// VM is stopped by warmstart's shutdown order, not by that signal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	inst.cmd = cmd
	if err := inst.run(f); err != nil {
		// The control reader ends when its write end closes here.
		f.closeAll()
		return nil, fmt.Errorf("replay vmm %s: start %s: %w", spec.SnapshotID, exe, err)
	}
	f.closeAfterStart()
	go inst.killWhenAbandoned(ctx)
	return inst, nil
}

// child is the executable a replay VMM for spec runs as and its
// configuration, checked.
func (v *VMM) child(ctx context.Context, spec vmm.RestoreSpec) (exe string, raw []byte, err error) {
	cfg := Config{Backend: spec.Backend, MemPath: spec.MemPath, Layout: spec.Layout, TracePath: v.TracePath, Remove: v.Remove, Paused: spec.Paused,
		WriteStamp: v.WriteStamp}
	if err := cfg.Validate(); err != nil {
		return "", nil, err
	}
	if err := ctx.Err(); err != nil {
		return "", nil, err
	}
	exe = v.Exe
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return "", nil, fmt.Errorf("find own executable: %w", err)
		}
	}
	if raw, err = json.Marshal(cfg); err != nil {
		return "", nil, fmt.Errorf("encode configuration: %w", err)
	}
	return exe, raw, nil
}

func (v *VMM) newVM(spec vmm.RestoreSpec) *VM {
	inst := &VM{
		output:       &tailBuffer{max: outputTailBytes},
		paused:       spec.Paused,
		readyTimeout: v.ReadyTimeout,
		stopTimeout:  DefaultStopTimeout,
		held:         make(chan struct{}),
		replies:      make(chan event, 1),
		vmStatePath:  spec.VMStatePath,
		ready:        make(chan struct{}),
		exited:       make(chan struct{}),
		extraOutput:  v.Output,
	}
	if v.StopTimeout > 0 {
		inst.stopTimeout = v.StopTimeout
	}
	return inst
}

// childFiles are the files between the parent and one child: the
// control channel, its stdin, and where its output goes.
type childFiles struct {
	controlR, controlW *os.File
	stdinR, stdinW     *os.File
	logFile            *os.File // nil without a runtime directory
	output             io.Writer
}

// openFiles opens the pipes and the log of inst's child; on error nothing
// is left open.
func (inst *VM) openFiles(spec vmm.RestoreSpec) (*childFiles, error) {
	f := &childFiles{}
	var err error
	if f.controlR, f.controlW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if f.stdinR, f.stdinW, err = os.Pipe(); err != nil {
		f.closeAll()
		return nil, err
	}
	inst.stdin = f.stdinW
	out := []io.Writer{inst.output}
	if spec.RuntimeDir != "" {
		inst.logPath = filepath.Join(spec.RuntimeDir, LogFile)
		if f.logFile, err = os.OpenFile(inst.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			f.closeAll()
			return nil, fmt.Errorf("open log: %w", err)
		}
		out = append(out, f.logFile)
	}
	if inst.extraOutput != nil {
		out = append(out, inst.extraOutput)
	}
	f.output = io.MultiWriter(out...)
	return f, nil
}

// closeAfterStart closes the child's ends, which the parent no longer
// needs once the child runs.
func (f *childFiles) closeAfterStart() {
	f.controlW.Close()
	f.stdinR.Close()
}

// closeAll closes everything opened, when the child could not start.
func (f *childFiles) closeAll() {
	for _, c := range []*os.File{f.controlR, f.controlW, f.stdinR, f.stdinW, f.logFile} {
		if c != nil {
			c.Close()
		}
	}
}

// run starts the child and the goroutines that follow it: one reads its
// control channel; one, locked to the thread that started the child (its
// Pdeathsig), reaps it and closes exited once every event it wrote is in.
func (inst *VM) run(f *childFiles) error {
	controlDone := make(chan struct{})
	go func() {
		defer close(controlDone)
		defer f.controlR.Close()
		inst.readControl(f.controlR)
	}()
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := inst.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := inst.cmd.Wait()
		<-controlDone // every event the child wrote is in before exited closes
		if f.logFile != nil {
			f.logFile.Close()
		}
		inst.mu.Lock()
		inst.waitErr = err
		inst.mu.Unlock()
		close(inst.exited)
	}()
	return <-started
}

// killWhenAbandoned kills the VMM when ctx ends before it reports ready.
func (inst *VM) killWhenAbandoned(ctx context.Context) {
	select {
	case <-ctx.Done():
		// Both may be ready at once and select picks at random: a VMM
		// that reported ready outlives the restore's context.
		select {
		case <-inst.ready:
			return
		default:
		}
		inst.kill("restore context ended before ready: " + context.Cause(ctx).Error())
	case <-inst.ready:
	case <-inst.exited:
	}
}

// withoutChildEnv drops a parent's own replay configuration (reexec.Environ
// replaces its role), so a replay VMM started
// from inside one (a test child) is configured only by what Start sets.
func withoutChildEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, ConfigEnv+"=") {
			out = append(out, kv)
		}
	}
	return out
}

func (i *VM) readControl(r io.Reader) {
	sc := bufio.NewScanner(r)
	readyClosed, heldClosed := false, false
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			continue // not a control line; the log has the child's output
		}
		switch e.Event {
		case eventPaused:
			if !heldClosed {
				close(i.held)
				heldClosed = true
			}
		case eventReady:
			if readyClosed {
				continue
			}
			i.mu.Lock()
			i.report = Report{
				SHA256: e.SHA256, TouchedPages: e.TouchedPages, RemovedPages: e.RemovedPages,
				Start: time.Unix(0, e.StartNs), FirstTouch: time.Unix(0, e.FirstTouchNs), Ready: time.Unix(0, e.ReadyNs),
			}
			i.mu.Unlock()
			close(i.ready)
			readyClosed = true
		case eventFrozen, eventDumped, eventDumpFailed, eventThawed:
			select {
			case i.replies <- e:
			default:
			}
		case eventError:
			i.mu.Lock()
			i.childError = e.Error
			i.mu.Unlock()
		}
	}
}

// PID is the replay VMM's process id.
func (i *VM) PID() int { return i.cmd.Process.Pid }

// LogPath is the child's output log, empty without a RuntimeDir.
func (i *VM) LogPath() string { return i.logPath }

// Exited is closed once the process has been reaped.
func (i *VM) Exited() <-chan struct{} { return i.exited }

// ExitStatus tells how the process ended: its exit status, why it was
// killed, its error and last output. Call it after Exited has closed.
func (i *VM) ExitStatus() string { return i.exitDescription() }

// Report returns what the VMM reported at ready; ok is false before that.
func (i *VM) Report() (r Report, ok bool) {
	select {
	case <-i.ready:
	default:
		return Report{}, false
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.report, true
}

// ProcessExit is how the process ended, once Exited has closed.
func (i *VM) ProcessExit() vmm.ProcessExit {
	select {
	case <-i.exited: // cmd.Wait has set ProcessState
		return vmm.ProcessExitOf(i.cmd.ProcessState)
	default:
		return vmm.ProcessExit{}
	}
}

// WaitReady waits for the ready report. If the VMM exits first, the error
// wraps ErrExited and quotes its exit status, its error and its last output.
func (i *VM) WaitReady(ctx context.Context) (vmm.ReadyInfo, error) {
	if i.readyTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, i.readyTimeout, fmt.Errorf("%w: no ready report within %v", ErrNotReady, i.readyTimeout))
		defer cancel()
	}
	select {
	case <-i.ready:
	case <-i.exited:
		select {
		case <-i.ready: // ready, then exited at once: still ready
		default:
			return vmm.ReadyInfo{}, fmt.Errorf("replay vmm pid %d: %w before ready: %s", i.PID(), ErrExited, i.exitDescription())
		}
	case <-ctx.Done():
		return vmm.ReadyInfo{}, fmt.Errorf("replay vmm pid %d: wait for ready: %w", i.PID(), context.Cause(ctx))
	}
	r, _ := i.Report()
	return vmm.ReadyInfo{
		Started: r.Start,
		Ready:   r.Ready,
		Detail: vmm.ReadyDetail{
			SHA256: r.SHA256, TouchedPages: r.TouchedPages, RemovedPages: r.RemovedPages,
			FirstTouch: r.FirstTouch, PID: i.PID(),
		},
	}, nil
}

// Paused is closed when a VMM restored with RestoreSpec.Paused has mapped
// its memory (and handed it to the page-fault handler) and waits for Resume.
func (i *VM) Paused() <-chan struct{} { return i.held }

// Resume lets a VMM restored with RestoreSpec.Paused run its trace. It does
// not wait; calling it again is a no-op.
func (i *VM) Resume() error {
	if i.isFrozen() {
		return i.thaw()
	}
	if !i.paused {
		return fmt.Errorf("replay vmm pid %d: resume: not restored paused", i.PID())
	}
	i.stdinMu.Lock()
	defer i.stdinMu.Unlock()
	switch {
	case i.stopSent:
		return fmt.Errorf("replay vmm pid %d: resume after stop", i.PID())
	case i.resumed:
		return nil
	}
	if _, err := i.stdin.Write([]byte("resume\n")); err != nil {
		return fmt.Errorf("replay vmm pid %d: resume: %w", i.PID(), err)
	}
	i.resumed = true
	return nil
}

// RequestStop asks the VMM to stop by closing its standard input, and has
// it killed if it has not exited within its stop timeout. It does not
// wait; a VMM that already exited is not an error.
func (i *VM) RequestStop() error {
	i.stdinMu.Lock()
	defer i.stdinMu.Unlock()
	if i.stopSent {
		return nil
	}
	i.stopSent = true
	time.AfterFunc(i.stopTimeout, func() {
		i.kill(fmt.Sprintf("did not exit within %v of the stop request", i.stopTimeout))
	})
	if err := i.stdin.Close(); err != nil {
		return fmt.Errorf("replay vmm pid %d: request stop: %w", i.PID(), err)
	}
	return nil
}

// Kill kills the VMM with SIGKILL without waiting.
func (i *VM) Kill() { i.kill("killed by its owner") }

func (i *VM) kill(reason string) {
	select {
	case <-i.exited:
		return
	default:
	}
	i.mu.Lock()
	if i.killReason == "" {
		i.killReason = reason
	}
	i.mu.Unlock()
	// os.Process signals through a pidfd, so a reaped pid cannot be hit.
	i.cmd.Process.Kill()
}

// Wait waits until the VMM has exited and been reaped. It returns nil for a
// clean exit after stop; otherwise an error with the exit status, the
// VMM's error and its last output. If ctx ends first, the VMM is killed and
// reaped before Wait returns, so no process is left behind.
func (i *VM) Wait(ctx context.Context) error {
	select {
	case <-i.exited:
	case <-ctx.Done():
		i.kill("wait context ended: " + context.Cause(ctx).Error())
		<-i.exited
		return fmt.Errorf("replay vmm pid %d: wait: %w (killed)", i.PID(), context.Cause(ctx))
	}
	i.mu.Lock()
	clean := i.waitErr == nil // a kill that lost the race to a clean exit is no failure
	i.mu.Unlock()
	if clean {
		return nil
	}
	return fmt.Errorf("replay vmm pid %d: %s", i.PID(), i.exitDescription())
}

// exitDescription tells how the process ended; call after exited closed.
func (i *VM) exitDescription() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	var parts []string
	if i.killReason != "" {
		parts = append(parts, "killed: "+i.killReason)
	}
	if i.waitErr != nil {
		parts = append(parts, i.waitErr.Error())
	} else {
		parts = append(parts, "exit status 0")
	}
	if i.childError != "" {
		parts = append(parts, "error: "+i.childError)
	}
	// The error quotes the end of the log rather than naming it: the log
	// is in the restore's runtime directory, which the restore removes as
	// it fails or stops, before anyone reads the error.
	if tail := i.output.lastLines(outputQuoteBytes); tail != "" {
		parts = append(parts, "last output: "+tail)
	}
	return strings.Join(parts, "; ")
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
	cut bool // bytes were dropped: the first line kept may be partial
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.cut = true
	}
	return len(p), nil
}

// lastLines returns the final lines that fit in maxBytes, joined with
// " | ", without a line cut at its start; a last line longer than
// maxBytes alone gives its end.
func (t *tailBuffer) lastLines(maxBytes int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(t.buf)), "\n")
	if t.cut && len(lines) > 1 {
		lines = lines[1:]
	}
	first, size := len(lines), 0
	for first > 0 {
		size += len(lines[first-1]) + len(" | ")
		if size-len(" | ") > maxBytes {
			break
		}
		first--
	}
	if first == len(lines) {
		return lastBytes(lines[len(lines)-1], maxBytes)
	}
	return strings.TrimSpace(strings.Join(lines[first:], " | "))
}

// lastBytes returns the end of s in at most n bytes, starting on a whole
// UTF-8 character.
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return s
}
