package restore

import (
	"log/slog"
	"sync"

	"warmstart/internal/vmm"
)

// A VM whose process exits after ready without Stop asking it to (it
// crashed, was killed, its guest shut down) leaves its instance holding the
// memory device, the prefetch task and the runtime directory for nothing.
// The instance notices: its state becomes exited, Exit says how the
// process ended, Exited closes, and the Restorer's log and observer are
// told. Stop still releases everything in the seed's order, and succeeds:
// its first step, stopping the VM, has merely happened already.

// Instance states, as State reports them.
const (
	// StateRunning: ready, neither exited nor stopped.
	StateRunning = "running"
	// StateExited: the VM's process exited on its own after ready.
	StateExited = "exited"
	// StateStopped: Stop was called while the VM ran.
	StateStopped = "stopped"
)

// ExitObserver is implemented by an Observer that also counts VMs that
// exited after ready.
type ExitObserver interface {
	VMExited(exit vmm.ProcessExit)
}

// exitWatch is what an instance knows of its VM's exit after ready.
type exitWatch struct {
	id      string
	log     *slog.Logger
	observe Observer

	mu       sync.Mutex
	stopping bool             // Stop has begun: an exit from now on is its doing
	status   *vmm.ProcessExit // set when the VM exited on its own
	exited   chan struct{}    // closed when status is set; nil before ready
}

// watch watches, from ready on, for vm's process to exit. A driver that
// cannot tell (it does not implement vmm.ExitReporter) leaves the instance
// running until it is stopped.
func (w *exitWatch) watch(vm vmm.VM) {
	w.exited = make(chan struct{})
	ex, ok := vm.(vmm.ExitReporter)
	if !ok {
		return
	}
	// The goroutine lives as long as the VMM process, which Stop ends.
	go func() {
		<-ex.Exited()
		w.note(ex)
	}()
}

// note records the VM's exit as its own doing, unless Stop came first.
func (w *exitWatch) note(ex vmm.ExitReporter) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopping || w.status != nil {
		return
	}
	st := ex.ProcessExit()
	w.status = &st
	// The observer hears of the exit before the lock is let go, so a Stop
	// that finds the exit recorded returns only after the observer knows
	// (observers count; they do not block).
	if o, ok := w.observe.(ExitObserver); ok {
		o.VMExited(st)
	}
	// The warning is written before Exited closes: a caller that reports
	// the exit as its last word (restore --hold) must not have this line
	// printed after it.
	if w.log != nil {
		w.log.Warn("VM exited after ready; its restore holds the memory device until it is stopped",
			"restore", w.id, "exit", st.String(), "detail", ex.ExitStatus())
	}
	close(w.exited)
}

// beginStop marks the start of Stop. An exit that already happened is
// recorded first, even if the watcher has not run yet: a stop racing the
// watcher must not take the VM's own exit for its own.
func (w *exitWatch) beginStop(vm vmm.VM) {
	if ex, ok := vm.(vmm.ExitReporter); ok && w.exited != nil {
		select {
		case <-ex.Exited():
			w.note(ex)
		default:
		}
	}
	w.mu.Lock()
	w.stopping = true
	w.mu.Unlock()
}

// state is StateRunning, StateExited or StateStopped.
func (w *exitWatch) state() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.status != nil:
		return StateExited
	case w.stopping:
		return StateStopped
	default:
		return StateRunning
	}
}

// exit is how the VM's process ended, once it exited on its own.
func (w *exitWatch) exit() (vmm.ProcessExit, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == nil {
		return vmm.ProcessExit{}, false
	}
	return *w.status, true
}
