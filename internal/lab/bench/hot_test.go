package bench

import (
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

type processOnly struct{ pid int }

func (p processOnly) PID() int { return p.pid }

// The hot control's warm-up VMM is held still while the timed restore
// runs, and runs again before it is stopped.
func TestHotControlHoldsItsWarmUpStill(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL); cmd.Wait() })
	if got := stopProcess(processOnly{pid}); got != pid {
		t.Fatalf("stopProcess = %d, want %d", got, pid)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WUNTRACED, nil); err != nil || !ws.Stopped() {
		t.Fatalf("warm-up process not stopped: status %v, %v", ws, err)
	}
	continueProcess(pid)
	if _, err := unix.Wait4(pid, &ws, unix.WCONTINUED, nil); err != nil || !ws.Continued() {
		t.Fatalf("warm-up process not continued: status %v, %v", ws, err)
	}
	if got := stopProcess(struct{}{}); got != 0 {
		t.Fatalf("stopProcess of a VM without a process = %d, want 0", got)
	}
	continueProcess(0) // nothing stopped: nothing to do
}
