package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/node"
)

// On a host with QEMU and no Firecracker, auto picks QEMU; with neither,
// the error names both missing binaries and the replay VMM.
func TestResolveDriverAuto(t *testing.T) {
	dir := t.TempDir()
	fakeQEMU := filepath.Join(dir, "qemu-system-x86_64")
	if err := os.WriteFile(fakeQEMU, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Runtime.Dir = dir
	cfg.Firecracker.Binary = filepath.Join(dir, "no-firecracker")
	cfg.QEMU.Binary = fakeQEMU
	got, err := node.ResolveDriver(context.Background(), cfg)
	if err != nil || got != config.DriverQEMU {
		t.Fatalf("with QEMU only: %q, %v; want qemu", got, err)
	}
	cfg.QEMU.Binary = filepath.Join(dir, "no-qemu")
	_, err = node.ResolveDriver(context.Background(), cfg)
	if err == nil {
		t.Fatal("with neither VMM: no error")
	}
	for _, want := range []string{"no-firecracker", "no-qemu", "--vmm replay --trace"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

// An explicit --vmm firecracker on a host without its binary names what
// is missing and the alternatives, not the agent address.
func TestWithVMMFirecrackerMissingBinary(t *testing.T) {
	cfg := config.Default()
	cfg.Firecracker.Binary = filepath.Join(t.TempDir(), "firecracker")
	_, err := node.WithVMM(cfg, config.DriverFirecracker, "")
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"no Firecracker binary", "--vmm qemu", "--vmm replay --trace"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
