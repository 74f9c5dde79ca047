package qemu

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// fakeQEMU writes an executable that fails at once: under it the KVM
// probe fails, so AccelAuto answers TCG unless a cached verdict says
// otherwise.
func fakeQEMU(t *testing.T, dir string) (binary, kernel string) {
	t.Helper()
	binary = filepath.Join(dir, "qemu-fake")
	kernel = filepath.Join(dir, "vmlinuz-fake")
	if err := os.WriteFile(binary, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kernel, []byte("not a kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	return binary, kernel
}

// The verdict a probe reached is kept in ProbeCacheDir, and a later
// driver (another process, in the field) takes it from there without
// probing: a cached "kvm" wins over what the failing binary would say.
func TestAccelProbeVerdictCachedOnDisk(t *testing.T) {
	dir := t.TempDir()
	binary, kernel := fakeQEMU(t, dir)
	cacheDir := filepath.Join(dir, "run")
	d, err := New(Options{Binary: binary, Kernel: kernel, ProbeCacheDir: cacheDir})
	if err != nil {
		t.Fatal(err)
	}
	accel, err := d.Accel(context.Background())
	if err != nil || accel != AccelTCG {
		t.Fatalf("Accel = %q, %v; want %q", accel, err, AccelTCG)
	}
	file := accelCacheFile(cacheDir, binary, kernel)
	if got, ok := readAccelCache(file); !ok || got != AccelTCG {
		t.Fatalf("cache %s holds %q (%v), want %q", file, got, ok, AccelTCG)
	}

	// A second kernel file: a fresh in-process entry, so only the disk
	// can answer "kvm".
	kernel2 := filepath.Join(dir, "vmlinuz-fake2")
	if err := os.WriteFile(kernel2, []byte("not a kernel either"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeAccelCache(accelCacheFile(cacheDir, binary, kernel2), AccelKVM)
	d2, err := New(Options{Binary: binary, Kernel: kernel2, ProbeCacheDir: cacheDir})
	if err != nil {
		t.Fatal(err)
	}
	if accel, err := d2.Accel(context.Background()); err != nil || accel != AccelKVM {
		t.Fatalf("Accel with a cached kvm verdict = %q, %v; want %q", accel, err, AccelKVM)
	}
}

// A changed kernel names another cache file: the verdict is per kernel.
func TestAccelCacheFileChangesWithKernel(t *testing.T) {
	dir := t.TempDir()
	binary, kernel := fakeQEMU(t, dir)
	before := accelCacheFile(dir, binary, kernel)
	if err := os.WriteFile(kernel, []byte("another kernel, another size"), 0o644); err != nil {
		t.Fatal(err)
	}
	if after := accelCacheFile(dir, binary, kernel); after == before || after == "" {
		t.Errorf("cache file %q after the kernel changed, want a new name (was %q)", after, before)
	}
	if accelCacheFile("", binary, kernel) != "" {
		t.Error("no cache directory should mean no cache file")
	}
}
