package restore_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/memdev"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
)

// killedStatus is how a VMM process killed with SIGKILL ended.
var killedStatus = vmm.ProcessExit{Code: -1, Signal: int(syscall.SIGKILL), SignalName: "killed"}

// TestVMKilledAfterReady: a VMM killed with SIGKILL after ready moves the
// instance to state exited with the signal, and the observer hears of it
// once. Stop then succeeds, reports the exit, and still releases in the
// seed's order: with a prefetch read held in the FUSE server, the device
// generation stays attached until the read returns.
func TestVMKilledAfterReady(t *testing.T) {
	e := newEnv(t, envOptions{})
	src := e.source(t)
	t.Run(config.DeviceFile, func(t *testing.T) { e.checkKilledAfterReadyFile(t, src) })
	t.Run(config.DeviceUffd, func(t *testing.T) { e.checkKilledAfterReadyUffd(t, src) })
}

// checkKilledAfterReadyFile: with a prefetch read held in the FUSE server,
// the stop of a killed VM reports the exit and releases the generation only
// once the read returns.
func (e *env) checkKilledAfterReadyFile(t *testing.T, src restore.Source) {
	first := e.manifest(t).Ranges[0].Offset
	gate := e.holdReadsAt(t, first)
	r, vm, _ := e.restorerWithTrace(t, farTrace(t, first))
	inst := e.restore(t, r, src, restore.Options{Prefetch: restore.ModeOn, Policy: policy(t, "seed")})
	// Should the test fail before it opens the gate, the gate opens
	// before the instance's cleanup stops it: a stop would wait for the
	// held read for ever.
	t.Cleanup(gate.open)
	waitFor(t, gate.arrived, "the prefetch read to reach the server")
	proc := vm.last(t)
	checkRunning(t, inst)

	killVM(t, inst, proc.PID())
	checkGone(t, proc)

	type stopResult struct {
		rep restore.StopReport
		err error
	}
	stopped := make(chan stopResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		rep, err := inst.StopReported(ctx)
		stopped <- stopResult{rep, err}
	}()
	// The generation is still attached while the read is held: a new
	// reference to the key shares it.
	same, err := e.srv.Attach(e.id, memdev.Request{Memory: src.Memory, IOEngine: 0})
	if err != nil {
		t.Fatal(err)
	}
	if same.Generation() != inst.Generation {
		t.Errorf("attach during stop got generation %d, want the held %d: the device was released under a read", same.Generation(), inst.Generation)
	}
	release(t, same) // not the last reference
	select {
	case res := <-stopped:
		t.Fatalf("stop returned (%v) while a prefetch read was held in the server", res.err)
	default:
	}

	gate.open()
	res := waitFor(t, stopped, "the stop to return")
	if res.err != nil {
		t.Fatalf("stop of an exited VM: %v", res.err)
	}
	if res.rep.Exit == nil || *res.rep.Exit != killedStatus {
		t.Errorf("stop report %+v; want the exit %v", res.rep, killedStatus)
	}
	if res.rep.PrefetchDrain <= 0 {
		t.Errorf("stop report %+v: the stop did not wait for the held prefetch read", res.rep)
	}
	next, err := e.srv.Attach(e.id, memdev.Request{Memory: src.Memory, IOEngine: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer release(t, next)
	if next.Generation() == inst.Generation {
		t.Errorf("generation %d still attached after stop returned", inst.Generation)
	}
	checkExitsObserved(t, e.observer, 1)
}

// checkKilledAfterReadyUffd: the stop of a killed VM on the uffd device
// reports the exit and removes the restore's runtime directory.
func (e *env) checkKilledAfterReadyUffd(t *testing.T, src restore.Source) {
	inst := e.restore(t, e.restorer, src, restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOn})
	proc := e.vm.last(t)
	checkRunning(t, inst)
	killVM(t, inst, proc.PID())
	rep, err := inst.StopReported(context.Background())
	if err != nil {
		t.Fatalf("stop of an exited VM: %v", err)
	}
	if rep.Exit == nil || *rep.Exit != killedStatus {
		t.Errorf("stop report %+v; want the exit %v", rep, killedStatus)
	}
	checkGone(t, proc)
	if _, err := os.Stat(filepath.Join(e.restorer.RuntimeDir, "restores", inst.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the restore's runtime directory (its uffd socket) is still there: %v", err)
	}
	checkExitsObserved(t, e.observer, 2)
}

// TestStoppedVMIsNotAnExit: a VM that exits because Stop asked it to is
// stopped, not exited, and nobody is told of an exit.
func TestStoppedVMIsNotAnExit(t *testing.T) {
	e := newEnv(t, envOptions{})
	inst := e.restore(t, e.restorer, e.source(t), restore.Options{})
	checkRunning(t, inst)
	rep, err := inst.StopReported(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Exit != nil {
		t.Errorf("stop report %+v: a stopped VM reported as exited on its own", rep)
	}
	if got := inst.State(); got != restore.StateStopped {
		t.Errorf("state after stop = %q, want %q", got, restore.StateStopped)
	}
	select {
	case <-inst.Exited():
		t.Error("Exited closed for a VM that Stop stopped")
	default:
	}
	checkExitsObserved(t, e.observer, 0)
}

func checkRunning(t *testing.T, inst *restore.Instance) {
	t.Helper()
	if got := inst.State(); got != restore.StateRunning {
		t.Errorf("state after ready = %q, want %q", got, restore.StateRunning)
	}
	if st, ok := inst.Exit(); ok {
		t.Errorf("exit status %v reported while the VM runs", st)
	}
}

// killVM sends SIGKILL to the VMM process and waits for the instance to
// notice.
func killVM(t *testing.T, inst *restore.Instance, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, inst.Exited(), "the instance to see its VM exit")
	if got := inst.State(); got != restore.StateExited {
		t.Errorf("state after the kill = %q, want %q", got, restore.StateExited)
	}
	if st, ok := inst.Exit(); !ok || st != killedStatus {
		t.Errorf("exit status %+v (known %t), want %+v", st, ok, killedStatus)
	}
}

func checkExitsObserved(t *testing.T, o *observer, want int) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.exits) != want {
		t.Fatalf("observer told of %d exits (%v), want %d", len(o.exits), o.exits, want)
	}
	for _, st := range o.exits {
		if st != killedStatus {
			t.Errorf("observer told of exit %+v, want %+v", st, killedStatus)
		}
	}
}

// TestExitIsLoggedBeforeItIsSignalled: the VM's exit is in the log before
// Exited closes. A caller that reports the exit as its last word (the CLI's
// "restore --hold") must not have the restore's own warning printed after
// it. The log handler holds the warning: Exited must still be open while
// the line is being written.
func TestExitIsLoggedBeforeItIsSignalled(t *testing.T) {
	e := newEnv(t, envOptions{})
	h := &heldWarnings{arrived: make(chan struct{}), release: make(chan struct{})}
	r := *e.restorer
	r.Log = slog.New(h)
	inst := e.restore(t, &r, e.source(t), restore.Options{})
	proc := e.vm.last(t)
	t.Cleanup(h.open)
	if err := syscall.Kill(proc.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, h.arrived, "the exit's warning to reach the log")
	select {
	case <-inst.Exited():
		t.Error("Exited closed before the exit's warning was written")
	default:
	}
	h.open()
	waitFor(t, inst.Exited(), "the instance to see its VM exit")
}

// heldWarnings is a log handler that holds the first warning of a VM's exit
// until opened, and drops every other record.
type heldWarnings struct {
	once    sync.Once
	arrived chan struct{}
	release chan struct{}
	opened  sync.Once
}

func (h *heldWarnings) open() { h.opened.Do(func() { close(h.release) }) }

func (h *heldWarnings) Enabled(context.Context, slog.Level) bool { return true }

func (h *heldWarnings) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level != slog.LevelWarn || !strings.HasPrefix(rec.Message, "VM exited") {
		return nil
	}
	first := false
	h.once.Do(func() { first = true; close(h.arrived) })
	if first {
		<-h.release
	}
	return nil
}

func (h *heldWarnings) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *heldWarnings) WithGroup(string) slog.Handler      { return h }
