package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/pause"
)

// stallStore stops the MinIO server of st with SIGSTOP: it keeps its
// connections and never answers, as a wedged store does. The test's
// cleanup resumes it before anything else of the test is undone.
func stallStore(t *testing.T, st *s3Store) error {
	t.Helper()
	pid := st.srv.PID()
	if pid == 0 {
		return errors.New("minio is not running")
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	return syscall.Kill(pid, syscall.SIGSTOP)
}

// TestShutdownWhileS3Stalls: the S3 store stops answering (SIGSTOP) while
// a pause publishes its child, and the daemon is shut down. The pause is
// cancelled once the grace is over and answered 503 with Retry-After,
// saying the daemon is shutting down; the failed publish's clean-up gives
// way to the shutdown (what it leaves is snapshot gc's); the VM is
// stopped with a context of its own and its device released; FUSE is
// unmounted; and the whole shutdown ends within daemon.ShutdownBound.
func TestShutdownWhileS3Stalls(t *testing.T) {
	st := newS3Store(t, "stalled")
	f := newFixture(t, fixtureOptions{})
	stalled := make(chan struct{})
	onFirstPauseAt(t, pause.StepPublish, func() {
		if err := stallStore(t, st); err != nil {
			t.Errorf("stall minio: %v", err)
		}
		close(stalled)
	})
	const grace, stopTimeout = 500 * time.Millisecond, 5 * time.Second
	r, _, in := pausableRestore(t, f, func(o *daemon.Options) {
		o.Repository = st.open(t)
		o.ShutdownGrace, o.StopTimeout = grace, stopTimeout
	})
	paused := goPause(r, in.ID, api.PauseRequest{Alias: "kid"})
	select {
	case <-stalled:
	case out := <-paused:
		t.Fatalf("the pause ended before it published: %+v, %v", out.res, out.err)
	case <-time.After(time.Minute):
		t.Fatal("the pause did not reach its publish within a minute")
	}
	bound := daemon.ShutdownBound(grace, stopTimeout)
	t0 := time.Now()
	shut := make(chan error, 1)
	go func() { shut <- r.d.Shutdown(context.Background()) }()
	select {
	case out := <-paused:
		wantShuttingDown(t, out.err)
		t.Logf("the pause answered %v after the shutdown began", time.Since(t0))
	case <-time.After(bound):
		t.Fatalf("the pause got no answer within %v of the shutdown", bound)
	}
	select {
	case err := <-shut:
		t.Logf("shutdown took %v (bound %v): %v", time.Since(t0), bound, err)
	case <-time.After(bound):
		t.Fatalf("shutdown still running after %v", bound)
	}
	for _, msg := range []string{"stopping restore", "restore stopped", "device released",
		"shutdown: devices released", "shutdown: FUSE unmounted", "shutdown complete"} {
		select {
		case <-r.log.logged(msg):
		default:
			t.Errorf("shutdown never logged %q", msg)
		}
	}
	if ms := mountsUnder(t, f.dir); len(ms) > 0 {
		t.Errorf("mounts left behind: %v", ms)
	}
}

// wantShuttingDown wants err to be the answer to a request the shutdown
// cut short: 503 with Retry-After, saying the daemon is shutting down.
func wantShuttingDown(t *testing.T, err error) {
	t.Helper()
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || ae.RetryAfter <= 0 ||
		!strings.Contains(ae.Message, daemon.ErrShuttingDown.Error()) {
		t.Errorf("answer %v (%#v); want 503 with Retry-After saying %q", err, ae, daemon.ErrShuttingDown)
	}
}
