package daemon_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/daemon"
	"warmstart/internal/repository/posixfs"
)

// startConfig is a daemon configuration under a fresh directory whose
// replay VMM names a trace that does not exist: building the VMM fails,
// so a test sees whether Serve got that far.
func startConfig(t *testing.T) (*config.Config, *posixfs.Repo) {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Runtime.Dir = filepath.Join(dir, "run")
	cfg.Daemon.Socket = filepath.Join(dir, "run", "ws.sock")
	cfg.VMM.Driver = config.DriverReplay
	cfg.Replay.Trace = filepath.Join(dir, "absent.trace")
	repo, err := posixfs.Open(filepath.Join(dir, "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, repo
}

// TestServeRefusesATokenlessPublicAddressBeforeBuildingTheVMM: a
// non-loopback listen without token_file is a configuration error that
// needs nothing probed, so serve says so at once rather than after the
// VMM probe (half a minute for QEMU under TCG) or instead of the VMM's
// own error.
func TestServeRefusesATokenlessPublicAddressBeforeBuildingTheVMM(t *testing.T) {
	cfg, repo := startConfig(t)
	err := daemon.Serve(context.Background(), cfg, repo, "0.0.0.0:0", io.Discard)
	if !errors.Is(err, daemon.ErrNoToken) {
		t.Fatalf("serve on 0.0.0.0 without token_file and with a VMM that cannot be built: %v; want ErrNoToken", err)
	}
}

// TestServeStoppedBeforeReadyEndsAsAShutdown: a signal while serve still
// builds its VMM ends it as a shutdown does, not with the VMM's
// "context canceled" as if the VMM had failed.
func TestServeStoppedBeforeReadyEndsAsAShutdown(t *testing.T) {
	cfg, repo := startConfig(t)
	cfg.VMM.Driver = config.DriverAuto
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("terminated signal received"))
	err := daemon.Serve(ctx, cfg, repo, "", io.Discard)
	if err != nil && strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("serve signalled before ready: %v; want it to end as a shutdown", err)
	}
}

// TestServeSaysItProbesTheVMM: building a QEMU VMM with accel auto may
// probe KVM for up to half a minute; serve logs a line before it (so an
// operator does not see a silent daemon) and one once the VMM is ready.
// With no kernel there is nothing to boot, so the probe answers at once.
func TestServeSaysItProbesTheVMM(t *testing.T) {
	cfg, repo := startConfig(t)
	cfg.VMM.Driver = config.DriverQEMU
	cfg.QEMU.Accel = config.AccelAuto
	cfg.QEMU.Kernel = filepath.Join(t.TempDir(), "absent-kernel")
	ctx, cancel := context.WithCancelCause(context.Background())
	// A serve that never says it is ready is stopped, so the test fails
	// rather than hangs.
	stop := time.AfterFunc(time.Minute, func() { cancel(errors.New("no ready line within a minute")) })
	defer stop.Stop()
	pr, pw := io.Pipe()
	served := make(chan error, 1)
	go func() {
		served <- daemon.Serve(ctx, cfg, repo, "", pw)
		pw.Close()
	}()
	var lines []string
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.Contains(sc.Text(), "VMM ready") {
			break
		}
	}
	cancel(errors.New("terminated signal received"))
	go io.Copy(io.Discard, pr)
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	log := strings.Join(lines, "\n")
	before := strings.Index(log, "probing whether KVM runs the guest (up to 30 s")
	after := strings.Index(log, "VMM ready")
	if before < 0 || after < before {
		t.Fatalf("serve's log does not say it probes the VMM, then that it is ready:\n%s", log)
	}
}
