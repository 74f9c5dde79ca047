package daemon_test

import (
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/daemon"
	"warmstart/internal/memdev/fusedev"
)

// An earlier daemon that is stopped (SIGSTOP), not dead, still holds its
// FUSE mount; a daemon started on the same mount gives up on the probe of
// it after fusedev.ProbeTimeout instead of hanging in it.
func TestStartBesideAStoppedDaemonDoesNotHang(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	c := startChild(t, f.cfgPath)
	if err := syscall.Kill(c.pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// kill returns before the child's threads have stopped: on a loaded
	// host one of them could still answer the new daemon's probe. The
	// stop is reported to the parent once every thread has stopped.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, c.pid, &info, unix.WSTOPPED|unix.WNOWAIT, nil); err != nil {
		t.Fatalf("wait for the daemon to stop: %v", err)
	}
	t.Cleanup(func() {
		syscall.Kill(c.pid, syscall.SIGCONT)
		syscall.Kill(c.pid, syscall.SIGTERM)
		<-c.exited
	})
	// Another runtime directory and socket, so the single-instance lock
	// does not refuse it first: only the mount is shared.
	cfg := *f.cfg
	cfg.Runtime.Dir = filepath.Join(f.dir, "run2")
	cfg.Daemon.Socket = filepath.Join(f.dir, "d2.sock")
	opts := f.options(t)
	opts.Config = &cfg
	start := time.Now()
	d, err := daemon.New(opts)
	if err == nil {
		d.Shutdown(t.Context())
		t.Fatal("a daemon started over a stopped daemon's live mount")
	}
	if !errors.Is(err, fusedev.ErrMountUnresponsive) {
		t.Fatalf("New = %v, want ErrMountUnresponsive", err)
	}
	if took := time.Since(start); took > fusedev.ProbeTimeout+10*time.Second {
		t.Fatalf("New took %v", took)
	}
}
