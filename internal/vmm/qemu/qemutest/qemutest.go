// Package qemutest holds what tests that boot the real guest share.
package qemutest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/vmm/qemu"
)

// RequireGuest skips where no real guest can run, except in CI
// (CI=true), where the tests must not silently vanish: there a missing
// QEMU, kernel or FUSE fails.
func RequireGuest(t testing.TB) {
	t.Helper()
	var missing []string
	if _, err := exec.LookPath(qemu.DefaultBinary); err != nil {
		missing = append(missing, qemu.DefaultBinary+" (apt-get install qemu-system-x86)")
	}
	if m, _ := filepath.Glob(qemu.KernelGlob); len(m) == 0 {
		missing = append(missing, "a kernel at "+qemu.KernelGlob+" (apt-get install linux-image-amd64)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		missing = append(missing, "/dev/fuse")
	}
	if len(missing) == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI must run the real-guest tests, but this host lacks %s", strings.Join(missing, ", "))
	}
	t.Skipf("no real guest here: missing %s", strings.Join(missing, ", "))
}
