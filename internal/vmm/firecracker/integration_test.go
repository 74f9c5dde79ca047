package firecracker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/vmm"
)

const (
	// kvmGetAPIVersion is KVM_GET_API_VERSION, _IO(0xAE, 0x00).
	kvmGetAPIVersion = 0xAE00
	// kvmAPIVersion is the only version KVM has ever reported.
	kvmAPIVersion        = 12
	integrationAgentPort = "49983"
)

// kvmUsable checks that /dev/kvm opens and speaks the stable KVM API.
func kvmUsable() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	v, err := unix.IoctlRetInt(int(f.Fd()), kvmGetAPIVersion)
	if err != nil {
		return fmt.Errorf("KVM_GET_API_VERSION: %w", err)
	}
	if v != kvmAPIVersion {
		return fmt.Errorf("KVM_GET_API_VERSION returned %d, want %d", v, kvmAPIVersion)
	}
	return nil
}

// TestFirecrackerIntegration runs a real Firecracker: boot → capture →
// restore from the captured memory file (File backend) → ready → stop.
// It needs a host where /dev/kvm runs ordinary guests, and:
//
//	WARMSTART_FIRECRACKER   path to the firecracker binary
//	WARMSTART_KERNEL        an uncompressed guest kernel (vmlinux)
//	WARMSTART_ROOTFS        a root filesystem image whose init starts an
//	                        agent answering GET /health with 2xx
//	WARMSTART_ENVD_ADDRESS  optional, where that agent listens; default
//	                        vsock:49983 (the guest gets a vsock device,
//	                        CID 3). http://… needs a network the test does
//	                        not set up.
//
// Example:
//
//	WARMSTART_FIRECRACKER=/usr/local/bin/firecracker \
//	WARMSTART_KERNEL=$PWD/vmlinux WARMSTART_ROOTFS=$PWD/rootfs.ext4 \
//	go test -race -run TestFirecrackerIntegration -v ./internal/vmm/firecracker
//
// Without them, or without a working /dev/kvm, the test skips and says
// which is missing.
func TestFirecrackerIntegration(t *testing.T) {
	vars := map[string]string{}
	var missing []string
	for _, name := range []string{"WARMSTART_FIRECRACKER", "WARMSTART_KERNEL", "WARMSTART_ROOTFS"} {
		if vars[name] = os.Getenv(name); vars[name] == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Skipf("real Firecracker test skipped: %s not set (see the comment at the top of integration_test.go)", strings.Join(missing, ", "))
	}
	if err := kvmUsable(); err != nil {
		t.Skipf("real Firecracker test skipped: /dev/kvm does not work: %v", err)
	}
	envd := os.Getenv("WARMSTART_ENVD_ADDRESS")
	if envd == "" {
		envd = "vsock:" + integrationAgentPort
	}
	d, err := New(Options{
		Binary:       vars["WARMSTART_FIRECRACKER"],
		LogLevel:     "Info",
		EnvdAddress:  envd,
		PollInterval: 10 * time.Millisecond,
		ReadyTimeout: time.Minute,
		Vsock:        true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bootDir := t.TempDir()
	m, err := d.Boot(ctx, BootSpec{
		RuntimeDir: bootDir, Kernel: vars["WARMSTART_KERNEL"], Rootfs: vars["WARMSTART_ROOTFS"],
		RootfsReadOnly: true, VCPUs: 1, MemoryMiB: 128,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = m.RequestStop()
		_ = m.Wait(context.Background())
	})
	if _, err := m.WaitReady(ctx); err != nil {
		t.Fatalf("boot: %v", err)
	}
	snapDir := t.TempDir()
	capture := CaptureSpec{VMStatePath: filepath.Join(snapDir, "vm.state"), MemPath: filepath.Join(snapDir, "mem"), After: StopAfterCapture}
	l, err := m.Capture(ctx, capture)
	if err != nil {
		t.Fatal(err)
	}
	if l.FileSize != 128<<20 || len(l.Regions) != 1 {
		t.Fatalf("layout %v of %d bytes, want one region of 128 MiB", l, l.FileSize)
	}

	spec := vmm.RestoreSpec{
		SnapshotID: "integration", VMStatePath: capture.VMStatePath,
		Backend: vmm.BackendFile, MemPath: capture.MemPath, Layout: l, RuntimeDir: t.TempDir(),
	}
	r, err := d.RestoreMachine(ctx, spec, RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := r.WaitReady(ctx)
	if err != nil {
		_ = r.RequestStop()
		_ = r.Wait(ctx)
		t.Fatalf("restore: %v", err)
	}
	t.Logf("restore to ready: %v (agent said %q)", info.Ready.Sub(info.Started), info.Detail["agent_answer"])
	if err := r.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if err := r.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	exit, _ := r.Exit()
	t.Logf("restored VM ended: %v", exit)
	for _, name := range []string{APISocketName, VsockSocketName} {
		if _, err := os.Stat(filepath.Join(spec.RuntimeDir, name)); err == nil {
			t.Errorf("%s left behind", name)
		}
	}
}
