package firecracker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"warmstart/internal/vmm"
)

// Machine is one Firecracker VM, restored or booted, and the process
// running it. It implements vmm.VM.
type Machine struct {
	opts       Options
	runtimeDir string
	proc       *process
	client     *Client
	probe      *agentProbe // nil without an agent address
	// sockets are the VM's sockets other than the API socket, removed
	// after exit.
	sockets []string
	// started is when the snapshot load or InstanceStart was sent.
	started time.Time
	// version is the release the process reported.
	version Version
	// tracking: the snapshot load asked for dirty page tracking, so a
	// Diff names exactly the pages changed (SaveDiff). memBytes is the
	// guest's memory, when the restore's layout said.
	tracking bool
	memBytes int64

	// diffMu serialises SaveDiff; it guards unsaved, diffLost and
	// exactHoles.
	diffMu sync.Mutex
	// unsaved are pages of a failed Diff that Firecracker forgot, kept
	// in unsavedPagesFile for the next Diff, ascending.
	unsaved []int64
	// diffLost, once set, refuses every later Diff: changed pages were
	// lost, so none would be complete.
	diffLost error
	// exactHoles are the file systems (device numbers) whose holes
	// checkExactHoles found exact.
	exactHoles map[uint64]bool

	mu            sync.Mutex
	stopRequested bool
	handlerDied   bool
	cleanupOnce   sync.Once
	cleanupErr    error
}

var (
	_ vmm.VM      = (*Machine)(nil)
	_ vmm.Resumer = (*Machine)(nil)
	_ vmm.Exiter  = (*Machine)(nil)

	_ vmm.ExitReporter = (*Machine)(nil)
)

// vmStateTimeout bounds a pause or resume made without a caller's context;
// Firecracker answers them in milliseconds.
const vmStateTimeout = 5 * time.Second

// launch spawns Firecracker in runtimeDir and waits for its API socket.
func (d *Driver) launch(ctx context.Context, runtimeDir string, sockets []string) (*Machine, error) {
	var probe *agentProbe
	if d.opts.EnvdAddress != "" {
		addr, err := parseAgentAddress(d.opts.EnvdAddress)
		if err != nil {
			return nil, err
		}
		probe = newAgentProbe(addr, runtimeDir, d.opts.ProbeTimeout)
	}
	proc, err := startProcess(d.opts, runtimeDir, sockets...)
	if err != nil {
		return nil, err
	}
	m := &Machine{
		opts:       d.opts,
		runtimeDir: runtimeDir,
		proc:       proc,
		client:     NewClient(proc.apiSocket),
		probe:      probe,
		sockets:    sockets,
	}
	if err := proc.waitForSocket(ctx, d.opts.StartTimeout); err != nil {
		m.abort(startKillReason(ctx))
		return nil, err
	}
	if m.version, err = m.queryVersion(ctx); err != nil {
		m.abort(startKillReason(ctx))
		return nil, err
	}
	return m, nil
}

func startKillReason(ctx context.Context) KillReason {
	if ctx.Err() != nil {
		return KillCanceled
	}
	return KillStartFailed
}

// abort kills a VM that failed half way through a restore or boot, and
// waits for it to be gone.
func (m *Machine) abort(reason KillReason) {
	m.proc.kill(reason)
	<-m.proc.exited
	_ = m.cleanup()
}

// failed turns an API error during start into the restore's or boot's
// error: the VM is killed and the error carries its log tail.
func (m *Machine) failed(ctx context.Context, step string, err error) error {
	m.abort(startKillReason(ctx))
	info := m.exitInfo()
	switch {
	case m.killedForHandler(info):
		return fmt.Errorf("%s: %w: %w", step, ErrHandlerDied, err)
	case info.KillReason == KillNone:
		// It ended on its own (a crash while loading), which is why
		// the request failed.
		return fmt.Errorf("%s: %w (%v)", step, &ExitError{Info: info, LogTail: m.proc.logTail()}, err)
	}
	return fmt.Errorf("%s: %w; %s", step, err, m.proc.logTail())
}

// killedForHandler reports whether the process, which ended as info says,
// was killed because its page-fault handler died. A handler also stops
// serving because its VMM exited; then the exit is the VMM's own.
func (m *Machine) killedForHandler(info ExitInfo) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.handlerDied && info.KillReason == KillHandlerDied
}

// Client is the API client of the machine's Firecracker process.
func (m *Machine) Client() *Client { return m.client }

// Version is the Firecracker release running the VM.
func (m *Machine) Version() Version { return m.version }

// PID is the Firecracker process's id.
func (m *Machine) PID() int { return m.proc.pid() }

// Exited is closed once the Firecracker process has exited and been reaped.
func (m *Machine) Exited() <-chan struct{} { return m.proc.exited }

// ExitStatus tells how the process ended, with the tail of its log and
// console. Call it after Exited has closed.
func (m *Machine) ExitStatus() string {
	return m.exitInfo().String() + "; " + m.proc.logTail()
}

// Resume lets paused vCPUs run: a VM restored with RestoreSpec.Paused, or
// one paused by Pause. It implements vmm.Resumer.
func (m *Machine) Resume() error { return m.setState(VMResumed) }

func (m *Machine) setState(state VMState) error {
	ctx, cancel := context.WithTimeout(context.Background(), vmStateTimeout)
	defer cancel()
	return m.client.SetVMState(ctx, state)
}

// watchHandler kills the VM if the page-fault handler serving its memory
// stops first: its vCPUs would otherwise block on the next fault forever.
func (m *Machine) watchHandler(done <-chan struct{}) {
	select {
	case <-done:
		m.mu.Lock()
		// After RequestStop a dying handler is part of a shutdown, not
		// a failure; the VM still goes, since it cannot finish stopping.
		if !m.stopRequested {
			m.handlerDied = true
		}
		m.mu.Unlock()
		m.proc.kill(KillHandlerDied)
	case <-m.proc.exited:
	}
}

// WaitReady polls the guest agent until it answers 2xx, the VM exits, the
// ready timeout passes, or ctx ends. Each probe has its own deadline.
func (m *Machine) WaitReady(ctx context.Context) (vmm.ReadyInfo, error) {
	if m.probe == nil {
		return vmm.ReadyInfo{}, errors.New("wait for guest agent: no envd address configured")
	}
	answer, err := waitForAgent(ctx, m.probe, m.opts.PollInterval, m.opts.ReadyTimeout, m.proc.exited)
	if errors.Is(err, errVMExited) {
		return vmm.ReadyInfo{}, m.notRunning()
	}
	if err != nil {
		return vmm.ReadyInfo{}, fmt.Errorf("wait for guest agent at %s: %w", m.opts.EnvdAddress, err)
	}
	return vmm.ReadyInfo{
		Started: m.started,
		Ready:   time.Now(),
		Detail: vmm.ReadyDetail{
			PID: m.PID(), APISocket: m.proc.apiSocket,
			AgentAnswer: answer, FirecrackerVersion: m.version.String(),
		},
	}, nil
}

// notRunning is WaitReady's error once the process has exited.
func (m *Machine) notRunning() error {
	if err := m.exitErr(); err != nil {
		return err
	}
	return ErrStopped
}

// exitErr is how an exited VM's end is reported: nil after RequestStop,
// ErrHandlerDied, or an ExitError with the log tail.
func (m *Machine) exitErr() error {
	info := m.exitInfo()
	switch {
	case m.killedForHandler(info):
		return fmt.Errorf("%w (%v)", ErrHandlerDied, info)
	case info.StopRequested:
		return nil
	default:
		return &ExitError{Info: info, LogTail: m.proc.logTail()}
	}
}

func (m *Machine) exitInfo() ExitInfo {
	info := m.proc.exitInfo()
	m.mu.Lock()
	info.StopRequested = m.stopRequested
	m.mu.Unlock()
	return info
}

// RequestStop sends SendCtrlAltDel and arms the stop timeout, after which
// the process is killed. A VM that is not running (paused, or still
// loading) is killed at once: Firecracker accepts the key press, but a
// paused guest acts on it only once resumed. It does not wait; Wait does.
func (m *Machine) RequestStop() error {
	m.mu.Lock()
	select {
	case <-m.proc.exited:
		// A request after the exit does not make the exit a stop.
		m.mu.Unlock()
		return nil
	default:
	}
	first := !m.stopRequested
	m.stopRequested = true
	m.mu.Unlock()
	if !first {
		return nil
	}
	m.proc.killAfter(m.opts.StopTimeout, KillStopTimeout)
	go m.sendCtrlAltDel()
	return nil
}

// sendCtrlAltDel asks a running guest to shut down, and kills a VM whose
// guest cannot act on it: nothing is gained by waiting out the timeout.
func (m *Machine) sendCtrlAltDel() {
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.StopTimeout)
	defer cancel()
	if info, err := m.client.Describe(ctx); err == nil && info.State != vmStateRunning {
		m.proc.kill(KillStopNotRunning)
		return
	}
	if err := m.client.Action(ctx, ActionSendCtrlAltDel); err != nil {
		// Refused: not started, or no i8042 device.
		m.proc.kill(KillStopRefused)
	}
}

// Wait blocks until the process has exited, then removes its sockets. It
// returns nil when the VM ended after RequestStop (even if it had to be
// killed; Exit tells), ErrHandlerDied when the page-fault handler died, and
// an ExitError when the VM exited on its own. When ctx ends first the
// process keeps running and Wait returns ctx's error.
func (m *Machine) Wait(ctx context.Context) error {
	select {
	case <-m.proc.exited:
	case <-ctx.Done():
		return fmt.Errorf("wait for firecracker pid %d: %w", m.PID(), ctx.Err())
	}
	if err := m.cleanup(); err != nil {
		return fmt.Errorf("clean up after firecracker pid %d: %w", m.PID(), err)
	}
	return m.exitErr()
}

// Exit returns how the process ended, and false while it runs.
func (m *Machine) Exit() (ExitInfo, bool) {
	select {
	case <-m.proc.exited:
		return m.exitInfo(), true
	default:
		return ExitInfo{}, false
	}
}

// ProcessExit is how the process ended, once Exited has closed; Exit
// tells more (who killed it and why).
func (m *Machine) ProcessExit() vmm.ProcessExit {
	select {
	case <-m.proc.exited: // the reaper has set proc.state
		return vmm.ProcessExitOf(m.proc.state)
	default:
		return vmm.ProcessExit{}
	}
}

// stopNow kills the VM and waits for it, for callers that have no use for
// a graceful shutdown. A killed process exits at once, so it waits even
// when ctx has ended: its callers promise the VM is gone when they return.
func (m *Machine) stopNow(ctx context.Context, reason KillReason) error {
	m.mu.Lock()
	m.stopRequested = true
	m.mu.Unlock()
	m.proc.kill(reason)
	return m.Wait(context.WithoutCancel(ctx))
}

func (m *Machine) cleanup() error {
	m.cleanupOnce.Do(func() {
		m.client.CloseIdleConnections()
		m.cleanupErr = m.proc.removeSockets(m.sockets...)
	})
	return m.cleanupErr
}
