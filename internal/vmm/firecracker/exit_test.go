package firecracker

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"warmstart/internal/vmm"
)

// TestExitedAfterReady: a VM killed after ready closes Exited, and
// ProcessExit names the signal; before, it reports nothing.
func TestExitedAfterReady(t *testing.T) {
	ctx := testContext(t)
	d := newTestDriver(t, fakeConfig{Agent: true}, nil)
	spec := fileRestore(t, 16)
	m := readyMachine(ctx, t, d, spec)
	select {
	case <-m.Exited():
		t.Fatal("Exited closed while the VM runs")
	default:
	}
	if st := m.ProcessExit(); st != (vmm.ProcessExit{}) {
		t.Errorf("exit status %+v while the VM runs, want none", st)
	}
	if err := syscall.Kill(m.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Exited():
	case <-ctx.Done():
		t.Fatal("Exited did not close after the VM was killed")
	}
	want := vmm.ProcessExit{Code: -1, Signal: int(syscall.SIGKILL), SignalName: "killed"}
	if st := m.ProcessExit(); st != want {
		t.Errorf("exit status %+v, want %+v", st, want)
	}
	if err := m.Wait(ctx); !errors.Is(err, ErrExited) {
		t.Fatalf("Wait after the kill: %v, want ErrExited", err)
	}
	requireGone(t, spec.RuntimeDir)
}

// TestExitStatusOutlivesRuntimeDir: a VM that exits on its own is reported
// with the tail of its log even once its runtime directory, where the log
// was, is gone: a restore removes that directory as it stops, and the exit
// may be described after that.
func TestExitStatusOutlivesRuntimeDir(t *testing.T) {
	ctx := testContext(t)
	d := newTestDriver(t, fakeConfig{Agent: true}, nil)
	spec := fileRestore(t, 16)
	m := readyMachine(ctx, t, d, spec)
	if err := syscall.Kill(m.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Exited():
	case <-ctx.Done():
		t.Fatal("Exited did not close after the VM was killed")
	}
	if err := os.RemoveAll(spec.RuntimeDir); err != nil {
		t.Fatal(err)
	}
	// The fake logs each API request; the load is among the last.
	const logged = "PUT /snapshot/load"
	if st := m.ExitStatus(); !strings.Contains(st, logged) {
		t.Errorf("exit status %q lacks the log line %q", st, logged)
	}
	if err := m.Wait(ctx); !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), logged) {
		t.Errorf("Wait: %v, want ErrExited with the log line %q", err, logged)
	}
}

// readyMachine restores spec with d and waits until the VM is ready.
func readyMachine(ctx context.Context, t *testing.T, d *Driver, spec vmm.RestoreSpec) *Machine {
	t.Helper()
	m, err := d.RestoreMachine(ctx, spec, RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return m
}
