package daemon_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/node"
	"warmstart/internal/trace"
)

// A restore whose client went away before the answer (a timeout, a CLI
// killed mid-request) is stopped, not held: nobody has its id to stop it.
// The client leaves just as its restore becomes ready, where a restore
// can no longer be cancelled by its request.
func TestRestoreOfAClientThatLeftIsStopped(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	r.importAs(t, f, "left")
	ctx, cancel := context.WithCancel(context.Background())
	daemon.SetRestoreReadyHook(t, func(request context.Context) {
		cancel()
		<-request.Done() // the daemon has seen the client go
	})
	if _, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: "left"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("client restore = %v, want it cancelled", err)
	}
	waitLogged(t, r.log, "request", "path", "/restores") // its handler has ended
	held, err := r.client.Restores(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 0 {
		t.Fatalf("the daemon holds %d restores after their client left: %+v", len(held), held)
	}
	if r.log.attrsOf("restore abandoned by its client") == nil {
		t.Error("the abandoned restore was not logged")
	}
}

// waitLogged polls until sink holds a record msg whose attribute key is
// value, failing the test if none comes within guardWait.
func waitLogged(t *testing.T, sink *logSink, msg, key, value string) {
	t.Helper()
	deadline := time.Now().Add(guardWait)
	for time.Now().Before(deadline) {
		sink.mu.Lock()
		for _, r := range sink.records {
			if r.msg == msg && r.attrs[key] == value {
				sink.mu.Unlock()
				return
			}
		}
		sink.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no %q record with %s=%s logged within %v", msg, key, value, guardWait)
}

// A client that leaves while its restore waits for ready cancels the
// restore; the daemon logs that as the client's doing (499), not as a
// failure of its own (an ERROR and a 500).
func TestRestoreCancelledByItsClientIsNoServerError(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	entries, err := trace.ReadFile(f.ref.Trace)
	if err != nil {
		t.Fatal(err)
	}
	entries[0].Compute += time.Minute // never ready within the test
	slow := filepath.Join(f.dir, "slow.trace")
	if err := trace.WriteFile(slow, entries); err != nil {
		t.Fatal(err)
	}
	f.writeConfig(t, fixtureOptions{trace: slow})
	r := startDaemon(t, f, nil)
	r.importAs(t, f, "gone")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: "gone"})
		done <- err
	}()
	if !waitForGlob(t, filepath.Join(f.cfg.Runtime.Dir, "daemon", "restores", "*", "replay-vmm.log"), done) {
		t.Fatalf("the restore ended before its VMM was seen: %v", <-done)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("client restore = %v, want it cancelled", err)
	}
	waitLogged(t, r.log, "request", "path", "/restores")
	if a := r.log.attrsOf("request failed"); a != nil {
		t.Errorf("a restore its client cancelled was logged as a failure: %v", a)
	}
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	for _, rec := range r.log.records {
		if rec.msg == "request" && rec.attrs["path"] == "/restores" && rec.attrs["status"] != "499" {
			t.Errorf("the cancelled restore request was logged with status %s, want 499", rec.attrs["status"])
		}
	}
}

// A daemon starting sweeps what CLI verbs killed on this node left in the
// runtime directory (their dead mounts among it), and leaves a live
// one's directory alone: on a node that talks to its daemon alone, no
// in-process verb would ever sweep them.
func TestDaemonStartSweepsDeadCLIDirs(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(f.cfg.Runtime.Dir, node.CLIDirPrefix+strconv.Itoa(gone.ProcessState.Pid()))
	live := filepath.Join(f.cfg.Runtime.Dir, node.CLIDirPrefix+strconv.Itoa(os.Getppid()))
	for _, dir := range []string{dead, live} {
		if err := os.MkdirAll(filepath.Join(dir, "restore-1"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	startDaemon(t, f, nil)
	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a dead CLI's runtime directory is still there (stat: %v)", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a live process's runtime directory was removed: %v", err)
	}
}

// A lock file replaced by something that is not a regular file (a FIFO,
// a directory) stops the daemon at once, naming what is there.
func TestDaemonLockFileNotRegular(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	if err := os.MkdirAll(f.cfg.Runtime.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(f.cfg.Runtime.Dir, "daemon.lock"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := f.options(t)
	if d, err := daemon.New(opts); err == nil || !strings.Contains(err.Error(), "not a regular file: it is a FIFO") {
		if err == nil {
			d.Shutdown(context.Background())
		}
		t.Fatalf("daemon.New with a FIFO lock file = %v, want an error naming the FIFO", err)
	}
}
