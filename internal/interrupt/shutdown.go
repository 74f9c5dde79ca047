package interrupt

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Shutdown watches for SIGINT and SIGTERM for a server (warmstart serve):
// the first cancels ctx, with the signal as its cause, and the server
// shuts down in its order, whose every step is bounded; a later signal
// changes nothing and says so on log rather than nothing. done ends the
// watch once the server has shut down.
//
// All signals go to one registration, made here, before serving: a second
// signal that came right after the first must not land before a later
// registration exists and be swallowed.
func Shutdown(log io.Writer) (ctx context.Context, done func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancelCause(context.Background())
	served := make(chan struct{})
	go watchShutdown(sigs, cancel, served, log)
	return ctx, func() {
		signal.Stop(sigs)
		close(served)
		cancel(nil)
	}
}

// watchShutdown begins the shutdown at the first signal (cancel, with the
// signal as the cause the server logs) and answers every later one, until
// the server has served (served closed).
func watchShutdown(sigs <-chan os.Signal, cancel context.CancelCauseFunc, served <-chan struct{}, log io.Writer) {
	for first := true; ; first = false {
		var sig os.Signal
		select {
		case sig = <-sigs:
		case <-served:
			return
		}
		if first {
			cancel(fmt.Errorf("%v signal received", sig))
			continue
		}
		fmt.Fprintf(log, "warmstart serve: %v again: still shutting down in order; every step is bounded, so it ends by itself\n", sig)
	}
}
