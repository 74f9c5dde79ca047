package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/api"
	"warmstart/internal/cli"
)

// "restores snapshot --then stop" whose stop fails once the child is
// published (a mount in the restore's directory keeps the stop from
// removing it) prints the child, says the stop failed and exits 4, so a
// script neither takes the pause for failed nor the stop for done.
func TestPauseVerbWhoseStopFails(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir, ref, sock := startVerbDaemon(t)
	spec, err := os.ReadFile(ref.Layout)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := runVerb(t, "--daemon", sock, "snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory,
		"--alias", "web", "--layout", strings.TrimSpace(string(spec))); err != nil {
		t.Fatalf("import: %v", err)
	}
	out, _, err := runVerb(t, "--daemon", sock, "restore", "web", "--pausable", "--hold", "--json")
	var in api.RestoreInfo
	if err != nil || json.Unmarshal([]byte(out), &in) != nil {
		t.Fatalf("restore --pausable --hold = %q, %v", out, err)
	}
	busy := filepath.Join(dir, "run", "daemon", "restores", in.ID, "busy")
	if err := os.Mkdir(busy, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", busy, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount a tmpfs in the restore's directory: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(busy, unix.MNT_DETACH) })
	out, _, err = runVerb(t, "--daemon", sock, "restores", "snapshot", in.ID, "--alias", "kid", "--then", "stop", "--json")
	var res api.PauseResult
	if jerr := json.Unmarshal([]byte(out), &res); jerr != nil || res.Snapshot == "" || res.StopError == "" {
		t.Fatalf("restores snapshot --json = %q (%v); want the child with stop_error", out, jerr)
	}
	if code := cli.ExitCode(err); code != cli.ExitStopFailed || !strings.Contains(err.Error(), res.Snapshot) ||
		!strings.Contains(err.Error(), "busy") {
		t.Fatalf("restores snapshot: exit %d, %v; want exit %d naming the child and why the stop failed", code, err, cli.ExitStopFailed)
	}
	if out, _, err := runVerb(t, "--daemon", sock, "snapshot", "show", "kid"); err != nil || !strings.Contains(out, res.Snapshot) {
		t.Fatalf("the child after the failed stop: %q, %v", out, err)
	}
}
