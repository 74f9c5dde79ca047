package vmm

import (
	"fmt"
	"os"
	"syscall"
)

// ExitReporter is an Exiter that also reports the exit as data, for
// callers that show an exit status or signal, or count exits by kind.
// Every driver here implements it.
type ExitReporter interface {
	Exiter
	// ProcessExit is how the process ended once Exited has closed; before
	// that it is the zero ProcessExit.
	ProcessExit() ProcessExit
}

// ProcessExit is how a VMM process ended: an exit status or a signal.
type ProcessExit struct {
	// Code is the process's exit status, -1 when a signal ended it.
	Code int `json:"code"`
	// Signal is the number of the signal that ended it, 0 when it exited.
	Signal int `json:"signal,omitempty"`
	// SignalName names that signal as the C library does ("killed").
	SignalName string `json:"signal_name,omitempty"`
}

// ProcessExitOf reads the status of a reaped process; nil (a wait that
// failed) reads as exit status -1.
func ProcessExitOf(ps *os.ProcessState) ProcessExit {
	if ps == nil {
		return ProcessExit{Code: -1}
	}
	e := ProcessExit{Code: ps.ExitCode()}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		e.Signal, e.SignalName = int(ws.Signal()), ws.Signal().String()
	}
	return e
}

// Signaled reports whether a signal ended the process.
func (e ProcessExit) Signaled() bool { return e.Signal != 0 }

func (e ProcessExit) String() string {
	if e.Signaled() {
		return fmt.Sprintf("killed by signal %d (%s)", e.Signal, e.SignalName)
	}
	return fmt.Sprintf("exit status %d", e.Code)
}
