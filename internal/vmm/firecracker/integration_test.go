package firecracker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/vmm/firecracker"
)

const (
	// kvmGetAPIVersion is KVM_GET_API_VERSION, _IO(0xAE, 0x00).
	kvmGetAPIVersion = 0xAE00
	// kvmAPIVersion is the only version KVM has ever reported.
	kvmAPIVersion        = 12
	integrationAgentPort = "49983"
)

// kvmUsable checks that /dev/kvm opens, speaks the stable KVM API, and
// comes from a module that runs ordinary guests.
func kvmUsable() error {
	loaded := func(module string) bool {
		_, err := os.Stat(filepath.Join("/sys/module", module))
		return err == nil
	}
	// A PVM host's /dev/kvm answers the API but runs only PVM guest
	// kernels; Firecracker's guest would never come up.
	if loaded("kvm_pvm") && !loaded("kvm_intel") && !loaded("kvm_amd") {
		return errors.New("it is provided by kvm_pvm, which runs only PVM guest kernels")
	}
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

// TestFirecrackerIntegration runs a real Firecracker through the production
// path: boot → capture (pause, Full snapshot, stop) → publish into a
// temporary POSIX repository → record the startup manifest in the
// background from the guest's reads through a tracing FUSE mount → restore
// through the FUSE device (File backend) with prefetch on and off, and
// through a userfaultfd (Uffd backend) with prefetch on and off → ready →
// stop. It needs a host where /dev/kvm runs ordinary guests, /dev/fuse,
// and:
//
//	WARMSTART_FIRECRACKER   path to the firecracker binary
//	WARMSTART_KERNEL        an uncompressed guest kernel (vmlinux)
//	WARMSTART_ROOTFS        a root filesystem image whose init starts an
//	                        agent answering GET /health with 2xx; it is
//	                        attached read-only
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
// Without them, or without a working /dev/kvm or /dev/fuse, the test skips
// and says which is missing. TestPublishRecordRestoreThroughFake runs the
// same path against fake Firecracker processes everywhere.
func TestFirecrackerIntegration(t *testing.T) {
	vars := map[string]string{}
	var missing []string
	for _, name := range []string{"WARMSTART_FIRECRACKER", "WARMSTART_KERNEL", "WARMSTART_ROOTFS"} {
		if vars[name] = os.Getenv(name); vars[name] == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Skipf("real Firecracker test skipped: %s not set (see the comment on TestFirecrackerIntegration)", strings.Join(missing, ", "))
	}
	if err := kvmUsable(); err != nil {
		t.Skipf("real Firecracker test skipped: /dev/kvm does not work: %v", err)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("real Firecracker test skipped: the FUSE memory device needs /dev/fuse: %v", err)
	}
	envd := os.Getenv("WARMSTART_ENVD_ADDRESS")
	if envd == "" {
		envd = "vsock:" + integrationAgentPort
	}
	d, err := firecracker.New(firecracker.Options{
		Binary:       vars["WARMSTART_FIRECRACKER"],
		LogLevel:     "Info",
		EnvdAddress:  envd,
		PollInterval: 10 * time.Millisecond,
		ReadyTimeout: time.Minute,
		Vsock:        strings.HasPrefix(envd, "vsock:"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f := newPublishFlow(t, d, 2*time.Minute)
	p := f.publish(t, ctx, firecracker.BootSpec{
		Kernel: vars["WARMSTART_KERNEL"], Rootfs: vars["WARMSTART_ROOTFS"], RootfsReadOnly: true,
		VCPUs: 1, MemoryMiB: 128,
	})
	t.Logf("booted agent answered %q", p.snap.Ready.Detail.AgentAnswer)
	for _, c := range restoreCases(t) {
		t.Run(c.name, func(t *testing.T) {
			inst := f.restoreOnce(t, ctx, p, c.opts)
			checkPrefetch(t, p, c.opts, inst)
			t.Logf("restored agent answered %q", inst.Ready.Detail.AgentAnswer)
		})
	}
}
