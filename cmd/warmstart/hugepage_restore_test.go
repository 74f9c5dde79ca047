package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestUffdRestoreOfHugePagesEnds restores a snapshot whose first region
// has 2 MiB pages on the uffd device. Where the host has huge pages to
// give, the guest reads the published bytes; where it has none (no
// hugetlb pool), the kernel never populates the region and the restore
// fails naming the fault. Either way it ends: the fault handler used to
// copy, be told the page exists, wake the VMM, which faulted again, for
// ever, both at full CPU.
func TestUffdRestoreOfHugePagesEnds(t *testing.T) {
	root := newCLIRoot(t, "wshuge-", 9)
	ref := root.ref
	if r := runCLI(t, "--config", root.cfg, "snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory,
		"--layout", "0:8MiB:2MiB,8MiB:8MiB", "--alias", "huge"); r.code != 0 {
		t.Fatalf("import exited %d: %s", r.code, r.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "--config", root.cfg, "restore", "huge",
		"--device", "uffd", "--prefetch", "off", "--trace", ref.Trace)
	cmd.Env = cliEnv("GORACE=atexit_sleep_ms=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("restore still running after 2 minutes; stderr:\n%s", stderr.String())
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		// The host has huge pages: the restore reached ready.
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		if !strings.Contains(stderr.String(), "fault at") {
			t.Errorf("restore failed without naming the fault:\n%s", stderr.String())
		}
	default:
		t.Fatalf("restore: %v\n%s", err, stderr.String())
	}
}
