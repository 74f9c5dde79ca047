package daemon_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/trace"
)

// holdFromBytes is where the SIGTERM test's device starts holding reads;
// the guest's short trace stays below lowTraceBytes, so only prefetch
// reads (which follow the full manifest) reach past it.
const (
	lowTraceBytes = 4 << 20
	holdFromBytes = 5 << 20
)

// SIGTERM while a restore is prefetching: the daemon stops accepting
// requests, stops the restore (its held prefetch read must return before
// the device is released), unmounts FUSE and removes its socket, in that
// order, and leaves no mount or socket behind.
func TestSIGTERMWhilePrefetching(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	recordInProcess(t, f)
	f.writeConfig(t, fixtureOptions{trace: writeLowTrace(t, f)})

	c := startChild(t, f.cfgPath, childHoldEnv+"="+strconv.Itoa(holdFromBytes))
	client := api.NewClient(f.cfg.Daemon.Socket)
	defer client.Close()
	// The seed's policy prefetches with buffered reads through the device
	// file, which reach the FUSE server and so its read hook.
	in, err := client.Restore(context.Background(), api.RestoreRequest{Snapshot: "ref", Device: "file", Prefetch: "on", Policy: "seed"})
	if err != nil {
		t.Fatal(err)
	}
	if in.Prefetch.State != "running" && in.Prefetch.State != "queued" {
		t.Fatalf("prefetch at ready is %q (%s); the held reads should keep it going", in.Prefetch.State, in.Prefetch.Reason)
	}
	c.wait(t, msgHolding)
	// The held read is a prefetch read in progress.
	if m := metricsOf(t, client); value(m, "warmstart_prefetch_readers_in_flight", nil) < 1 {
		t.Errorf("readers in flight = %v while a prefetch read is held", value(m, "warmstart_prefetch_readers_in_flight", nil))
	}

	if err := syscall.Kill(c.pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-c.exited
	if c.err != nil {
		t.Fatalf("daemon child exited with %v", c.err)
	}
	checkShutdownOrder(t, c.messages())
	if ms := mountsUnder(t, f.dir); len(ms) > 0 {
		t.Errorf("mounts left behind: %v", ms)
	}
	if _, err := os.Lstat(f.cfg.Daemon.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket %s left behind (%v)", f.cfg.Daemon.Socket, err)
	}
}

// recordInProcess imports the reference as ref and records its full
// startup manifest with a daemon in this process, then shuts it down.
func recordInProcess(t *testing.T, f *fixture) {
	t.Helper()
	r := startDaemon(t, f, nil)
	ctx := context.Background()
	r.importAs(t, f, "ref")
	if _, err := r.client.RecordManifest(ctx, "ref"); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// writeLowTrace writes the reference trace's touches below lowTraceBytes
// to a file of its own, so that a guest playing it is ready while prefetch
// still has the rest of the manifest to read; it returns the file's path.
func writeLowTrace(t *testing.T, f *fixture) string {
	t.Helper()
	entries, err := trace.ReadFile(f.ref.Trace)
	if err != nil {
		t.Fatal(err)
	}
	var low []trace.Entry
	for _, e := range entries {
		if e.Offset < lowTraceBytes {
			low = append(low, e)
		}
	}
	if len(low) == 0 || len(low) == len(entries) {
		t.Fatalf("reference trace has %d of %d touches below %d; the test needs some on both sides", len(low), len(entries), lowTraceBytes)
	}
	lowTrace := filepath.Join(f.dir, "low.trace")
	if err := trace.WriteFile(lowTrace, low); err != nil {
		t.Fatal(err)
	}
	return lowTrace
}

// shutdownOrder is the order in which a daemon stopped by SIGTERM logs the
// steps of its shutdown.
var shutdownOrder = []string{
	"shutdown begun",
	"shutdown: no longer accepting requests",
	"stopping restore",
	msgReleased,
	"restore stopped",
	"shutdown: restores stopped",
	"device released",
	"shutdown: devices released",
	"shutdown: FUSE unmounted",
	"shutdown: socket removed",
	"shutdown complete",
}

// checkShutdownOrder: the child logged every step of shutdownOrder, each
// first logged after the one ahead of it, and its restore stopped only
// after waiting for the prefetch reads.
func checkShutdownOrder(t *testing.T, lines []map[string]any) {
	t.Helper()
	at := map[string]int{}
	for i, l := range lines {
		msg, _ := l["msg"].(string)
		if _, seen := at[msg]; !seen {
			at[msg] = i
		}
		if msg == "restore stopped" {
			if drain, _ := l["prefetch_drain"].(float64); drain <= 0 {
				t.Errorf("restore stopped without waiting for prefetch reads: %v", l)
			}
		}
	}
	prev := -1
	for _, msg := range shutdownOrder {
		i, ok := at[msg]
		if !ok {
			t.Fatalf("the child never logged %q", msg)
		}
		if i <= prev {
			t.Errorf("%q logged at line %d, before the step ahead of it (line %d)", msg, i, prev)
		}
		prev = i
	}
}

// A daemon killed outright leaves its socket and a dead FUSE mount; the
// next one cleans both up and works.
func TestRestartAfterCrash(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	c := startChild(t, f.cfgPath)
	if _, err := api.NewClient(f.cfg.Daemon.Socket).Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(c.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.exited
	if _, err := os.Lstat(f.cfg.Daemon.Socket); err != nil {
		t.Fatalf("the killed daemon left no socket (%v); nothing to test", err)
	}
	if !mounted(t, f.cfg.Memory.FUSEMount) {
		t.Fatal("the killed daemon left no mount; nothing to test")
	}

	r := startDaemon(t, f, nil)
	<-r.log.logged("removed stale socket of an earlier daemon")
	ctx := context.Background()
	imp := r.importAs(t, f, "")
	in, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: imp.ID, Prefetch: "off"})
	if err != nil {
		t.Fatal(err)
	}
	if in.Ready.SHA256 != f.expected {
		t.Fatalf("restore after restart read sha256 %s, want %s", in.Ready.SHA256, f.expected)
	}
	if _, err := r.client.StopRestore(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
}

func TestStartRefusals(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	opts := f.options(t)

	t.Run("not a socket", func(t *testing.T) {
		if err := os.WriteFile(f.cfg.Daemon.Socket, []byte("keep me"), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(f.cfg.Daemon.Socket)
		if d, err := daemon.New(opts); err == nil {
			d.Shutdown(context.Background())
			t.Fatal("started over a regular file at the socket path")
		}
		if b, err := os.ReadFile(f.cfg.Daemon.Socket); err != nil || string(b) != "keep me" {
			t.Fatalf("the file at the socket path was touched: %q, %v", b, err)
		}
		if mounted(t, f.cfg.Memory.FUSEMount) {
			t.Fatal("a refused start left its mount")
		}
	})

	t.Run("live daemon", func(t *testing.T) {
		r := startDaemon(t, f, nil)
		second := *f.cfg
		second.Memory.FUSEMount = filepath.Join(f.dir, "mnt2")
		o := opts
		o.Config = &second
		if d, err := daemon.New(o); !errors.Is(err, daemon.ErrAlreadyRunning) {
			if err == nil {
				d.Shutdown(context.Background())
			}
			t.Fatalf("second daemon on a live socket: %v, want ErrAlreadyRunning", err)
		}
		if mounted(t, second.Memory.FUSEMount) {
			t.Fatal("a refused start left its mount")
		}
		if _, err := r.client.Health(context.Background()); err != nil {
			t.Fatalf("the live daemon stopped answering: %v", err)
		}
	})

	t.Run("stale socket", func(t *testing.T) {
		ln, err := net.Listen("unix", f.cfg.Daemon.Socket)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		r := startDaemon(t, f, nil)
		<-r.log.logged("removed stale socket of an earlier daemon")
		if _, err := r.client.Health(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Requests still running when the shutdown grace ends are cancelled, and
// shutdown waits for them to return before it stops restores.
func TestShutdownCancelsRequestsAfterGrace(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	release := make(chan struct{})
	held := make(chan struct{})
	var holdOnce sync.Once
	r := startDaemon(t, f, func(o *daemon.Options) {
		o.ShutdownGrace = 50 * time.Millisecond
		// Every device read waits, so the guest never becomes ready.
		o.FUSE.ReadHook = func(uint64, int64, int) {
			holdOnce.Do(func() { close(held) })
			<-release
		}
	})
	ctx := context.Background()
	imp := r.importAs(t, f, "")
	restored := make(chan error, 1)
	go func() {
		_, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: imp.ID, Prefetch: "off"})
		restored <- err
	}()
	<-held
	cancelled := r.log.logged("shutdown: grace over; requests still running cancelled")
	shut := make(chan error, 1)
	go func() { shut <- r.d.Shutdown(ctx) }()
	<-cancelled
	// The guest's held fault can only complete now; its restore was
	// cancelled first.
	close(release)
	var ae *api.APIError
	if err := <-restored; !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("restore cut by shutdown: %v, want 503", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if mounted(t, f.cfg.Memory.FUSEMount) {
		t.Errorf("%s is still mounted", f.cfg.Memory.FUSEMount)
	}
}
