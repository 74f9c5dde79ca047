package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A snapshot QEMU captured does not "restore" under the replay VMM: the
// verb exits 1 naming the driver key and the format it found, and leaves
// no mount or runtime directory behind.
func TestRestoreRefusesAnotherVMMsSnapshot(t *testing.T) {
	root := newCLIRoot(t, "wsforeign-", 3)
	state := filepath.Join(root.dir, "qemu_state.bin")
	if err := os.WriteFile(state, []byte("QEVM\x00\x00\x00\x03\x07\x00\x00\x00"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runVerb(t, "--config", root.cfg, "snapshot", "import", "--vm-state", state, "--memory", root.ref.Memory,
		"--alias", "guest", "--layout", root.layout); err != nil {
		t.Fatalf("import: %v", err)
	}
	got := runCLI(t, "--config", root.cfg, "restore", "guest", "--vmm", "replay", "--trace", root.ref.Trace)
	if got.code != 1 || !strings.Contains(got.stderr, `[vmm] driver = "replay"`) || !strings.Contains(got.stderr, "QEMU migration stream") ||
		!strings.Contains(got.stderr, "--vmm qemu") {
		t.Fatalf("restore of a QEMU snapshot under the replay VMM: exit %d, stderr:\n%s\nwant exit 1 naming the driver and the format", got.code, got.stderr)
	}
	t.Logf("stderr: %s", got.stderr)
	if m := mountPointsBelow(t, root.run); len(m) != 0 {
		t.Errorf("mounts left behind: %v", m)
	}
}
