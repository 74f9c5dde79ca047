package daemon_test

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

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
