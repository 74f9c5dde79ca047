// Package interrupt turns SIGINT and SIGTERM into cancellation for the
// commands that clean up after themselves (warmstart bench, demo, capture,
// restore, synth, the snapshot verbs that write or read at length, and
// warmstart-s3bench, which bench --repository s3 runs), so that each ends
// with the same messages and exit status however it was started; and for
// warmstart serve, whose shutdown a signal begins (Shutdown).
package interrupt

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// Watch turns SIGINT and SIGTERM into cancellation. The first signal ends
// Work: the command stops what runs in its shutdown order (a trial stops
// its restores and unmounts) and removes what it made. A second signal
// ends Force: steps of that shutdown which wait (a trial given time to
// stop cleanly, a restore waiting for its device's release) are cut short,
// what they wait for is killed, and what it leaves is detached and removed
// all the same. No signal kills the process before Result, so none cuts
// its cleanup off.
type Watch struct {
	Work, Force context.Context
	stopWork    context.CancelFunc
	stopForce   context.CancelFunc
	signals     chan os.Signal
	done        chan struct{}
	// first is the first signal received; read it only after stop.
	first syscall.Signal
	// bounded: the command's stop ends by itself, and a second signal
	// has nothing to cut short (see NotifyBounded).
	bounded bool
}

// Notify starts watching for SIGINT and SIGTERM, telling log what each one
// does.
func Notify(log io.Writer) *Watch { return notify(log, false) }

// NotifyBounded is Notify for a command whose stop ends by itself within
// a bound (a restore stops its VM in order, waiting at most a minute): a
// second signal ends nothing early, and the messages say so rather than
// promise a kill.
func NotifyBounded(log io.Writer) *Watch { return notify(log, true) }

func notify(log io.Writer, bounded bool) *Watch {
	w := &Watch{signals: make(chan os.Signal, 2), done: make(chan struct{}), bounded: bounded}
	w.Work, w.stopWork = context.WithCancel(context.Background())
	w.Force, w.stopForce = context.WithCancel(context.Background())
	signal.Notify(w.signals, syscall.SIGINT, syscall.SIGTERM)
	go w.watch(log)
	return w
}

func (w *Watch) watch(log io.Writer) {
	defer close(w.done)
	for n := 0; ; n++ {
		var sig os.Signal
		select {
		case sig = <-w.signals:
		case <-w.Force.Done():
			return // stopped
		}
		name := unix.SignalName(sig.(syscall.Signal))
		switch {
		case n == 0 && w.bounded:
			w.first = sig.(syscall.Signal)
			fmt.Fprintf(log, "warmstart: %s: stopping and removing temporary files\n", name)
			w.stopWork()
		case w.bounded:
			fmt.Fprintf(log, "warmstart: %s again: still stopping; the stop ends by itself\n", name)
		case n == 0:
			w.first = sig.(syscall.Signal)
			fmt.Fprintf(log, "warmstart: %s: stopping and removing temporary files (signal again to kill what is still running)\n", name)
			w.stopWork()
		case n == 1:
			fmt.Fprintf(log, "warmstart: %s again: killing what is still running\n", name)
			w.stopForce()
		}
	}
}

// stop ends the watch and returns the first signal received, 0 if none.
// Signals act as they would without the watch from then on.
func (w *Watch) stop() syscall.Signal {
	signal.Stop(w.signals)
	w.stopForce()
	<-w.done
	w.stopWork()
	return w.first
}

// Result stops the watch and returns what the command ends with: once a
// signal arrived, an Error (the command exits 128 + the signal's number,
// the shell's convention) carrying err; err otherwise.
func (w *Watch) Result(err error) error {
	if sig := w.stop(); sig != 0 {
		return Error{Signal: sig, Err: err}
	}
	return err
}

// Error ends a command that a signal stopped.
type Error struct {
	Signal syscall.Signal
	// Err is what the command ended with besides, nil if nothing.
	Err error
}

func (e Error) Error() string {
	msg := "interrupted by " + unix.SignalName(e.Signal)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e Error) Unwrap() error { return e.Err }

// ExitCode is the status a shell reports for a process the signal ended.
func (e Error) ExitCode() int { return 128 + int(e.Signal) }
