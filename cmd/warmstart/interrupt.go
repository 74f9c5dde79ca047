package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev/fusedev"
)

// interruption turns SIGINT and SIGTERM into cancellation for verbs that
// clean up after themselves. The first signal ends work: the verb stops
// what runs in its shutdown order (a trial stops its restores and
// unmounts) and removes what it made. A second signal ends force: steps of
// that shutdown which wait (a trial given time to stop cleanly, a restore
// waiting for its device's release) are cut short, what they wait for is
// killed, and what it leaves is detached and removed all the same. No
// signal kills the process before stop, so none cuts its cleanup off.
type interruption struct {
	work, force context.Context
	stopWork    context.CancelFunc
	stopForce   context.CancelFunc
	signals     chan os.Signal
	done        chan struct{}
	// first is the first signal received; read it only after stop.
	first syscall.Signal
}

// notifyInterrupt starts watching for SIGINT and SIGTERM, telling log
// what each one does.
func notifyInterrupt(log io.Writer) *interruption {
	in := &interruption{signals: make(chan os.Signal, 2), done: make(chan struct{})}
	in.work, in.stopWork = context.WithCancel(context.Background())
	in.force, in.stopForce = context.WithCancel(context.Background())
	signal.Notify(in.signals, syscall.SIGINT, syscall.SIGTERM)
	go in.watch(log)
	return in
}

func (in *interruption) watch(log io.Writer) {
	defer close(in.done)
	for n := 0; ; n++ {
		var sig os.Signal
		select {
		case sig = <-in.signals:
		case <-in.force.Done():
			return // stopped
		}
		name := unix.SignalName(sig.(syscall.Signal))
		switch n {
		case 0:
			in.first = sig.(syscall.Signal)
			fmt.Fprintf(log, "warmstart: %s: stopping and removing temporary files (signal again to kill what is still running)\n", name)
			in.stopWork()
		case 1:
			fmt.Fprintf(log, "warmstart: %s again: killing what is still running\n", name)
			in.stopForce()
		}
	}
}

// stop ends the watch and returns the first signal received, 0 if none.
// Signals act as they would without the watch from then on.
func (in *interruption) stop() syscall.Signal {
	signal.Stop(in.signals)
	in.stopForce()
	<-in.done
	in.stopWork()
	return in.first
}

// result stops the watch and returns what the verb ends with: once a
// signal arrived, an interruptedError (main exits 128 + the signal's
// number, the shell's convention) carrying err; err otherwise.
func (in *interruption) result(err error) error {
	if sig := in.stop(); sig != 0 {
		return interruptedError{sig: sig, err: err}
	}
	return err
}

// interruptedError ends a verb that a signal stopped.
type interruptedError struct {
	sig syscall.Signal
	err error
}

func (e interruptedError) Error() string {
	msg := "interrupted by " + unix.SignalName(e.sig)
	if e.err != nil {
		msg += ": " + e.err.Error()
	}
	return msg
}

func (e interruptedError) Unwrap() error { return e.err }

// exitCode is the status a shell reports for a process the signal ended.
func (e interruptedError) exitCode() int { return 128 + int(e.sig) }

// removeWorkDir removes a verb's temporary directory. A child killed
// before it unmounted (a trial after a second signal) would leave a dead
// FUSE mount there, which RemoveAll cannot descend; such mounts are
// detached first, and a live one is reported rather than removed under.
func removeWorkDir(dir string) error {
	if err := fusedev.CleanStale(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}
