package interrupt

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writes is an io.Writer that hands each write to the test.
type writes chan string

func (w writes) Write(p []byte) (int, error) {
	w <- string(p)
	return len(p), nil
}

// The first signal begins the daemon's shutdown, with the signal as its
// cause; each later one, however soon after the first, is answered, until
// the daemon has served. Both signals are queued before the watcher runs:
// a second signal that lands before anyone listens for it was swallowed
// (TestServeSecondSignalSaysItIsStillShuttingDown failed so on a loaded
// host).
func TestServeSignalsBeginThenAnswer(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	sigs <- syscall.SIGTERM
	sigs <- os.Interrupt
	ctx, cancel := context.WithCancelCause(context.Background())
	served := make(chan struct{})
	out := make(writes, 1)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		watchShutdown(sigs, cancel, served, out)
	}()

	select {
	case line := <-out:
		if !strings.Contains(line, "interrupt again: still shutting down") {
			t.Errorf("answer to the second signal = %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second signal was not answered")
	}
	if got := context.Cause(ctx); got == nil || got.Error() != "terminated signal received" {
		t.Errorf("shutdown cause = %v, want the first signal", got)
	}
	close(served)
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not end when the daemon had served")
	}
}
