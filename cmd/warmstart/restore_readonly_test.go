package main

import (
	"strings"
	"testing"
)

// TestInProcessRestoreWarnsOfNothing restores a snapshot with a recorded
// manifest in process, prefetch on: the verb opens the store read-only,
// so it has nowhere to store a refined manifest and must not try to (it
// used to warn on every restore that the refinement failed, the store
// being read-only).
func TestInProcessRestoreWarnsOfNothing(t *testing.T) {
	root := newCLIRoot(t, "wsro-", 7)
	ref := root.ref
	if r := runCLI(t, "--config", root.cfg, "snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory,
		"--layout", root.layout, "--alias", "ro"); r.code != 0 {
		t.Fatalf("import exited %d: %s", r.code, r.stderr)
	}
	if r := runCLI(t, "--config", root.cfg, "snapshot", "record-manifest", "ro", "--trace", ref.Trace); r.code != 0 {
		t.Fatalf("record-manifest exited %d: %s", r.code, r.stderr)
	}
	for _, device := range []string{"file", "uffd"} {
		r := runCLI(t, "--config", root.cfg, "restore", "ro", "--prefetch", "on", "--device", device, "--trace", ref.Trace)
		if r.code != 0 {
			t.Fatalf("restore on %s exited %d: %s", device, r.code, r.stderr)
		}
		if !strings.Contains(r.stdout, "recorded manifest") {
			t.Errorf("restore on %s did not prefetch the recorded manifest:\n%s", device, r.stdout)
		}
		if strings.Contains(r.stderr, "level=WARN") || strings.Contains(r.stderr, "level=ERROR") {
			t.Errorf("restore on %s logged a warning:\n%s", device, r.stderr)
		}
	}
}
