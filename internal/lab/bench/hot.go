package bench

import (
	"context"

	"golang.org/x/sys/unix"

	"warmstart/internal/restore"
	"warmstart/internal/vmm"
)

// warmControl is the hot control's warm-up restore. Its device generation,
// and so the device file's page cache, stays referenced while the timed
// restore shares it; its VMM process is stopped (SIGSTOP) meanwhile, so
// the control does not pay for a second running guest on the same cores
// (an idle guest under TCG still runs its timers), which a restore on a
// node with one guest never pays either.
type warmControl struct {
	inst    *restore.Instance
	stopped int // the VMM's pid while it is stopped, else 0
}

// holdWarm starts the hot control's warm-up restore of src and stops its
// VMM process.
func holdWarm(ctx context.Context, r *restore.Restorer, src restore.Source, opts restore.Options) (*warmControl, error) {
	inst, err := r.Restore(ctx, src, opts)
	if err != nil {
		return nil, err
	}
	return &warmControl{inst: inst, stopped: stopProcess(inst.VM())}, nil
}

// stopProcess stops vm's process (SIGSTOP) when it runs as one, and
// returns its pid, or 0 when nothing was stopped.
func stopProcess(vm any) int {
	p, ok := vm.(vmm.Process)
	if !ok || p.PID() <= 0 || unix.Kill(p.PID(), unix.SIGSTOP) != nil {
		return 0
	}
	return p.PID()
}

// Stop lets the VMM process run again, then stops the restore. It is safe
// to call more than once.
func (w *warmControl) Stop(ctx context.Context) error {
	continueProcess(w.stopped)
	w.stopped = 0
	return w.inst.Stop(ctx)
}

// continueProcess lets a process stopProcess stopped run again (pid 0:
// none was).
func continueProcess(pid int) {
	if pid > 0 {
		_ = unix.Kill(pid, unix.SIGCONT) // gone already: nothing to continue
	}
}
