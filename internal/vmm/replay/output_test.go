package replay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/layout"
)

// TestExitQuotesBoundedOutput: a VMM that writes pages of output and dies
// is reported with the end of that output in whole lines, bounded by
// outputQuoteBytes, and not by the path of its log: the log goes with the
// restore's runtime directory.
func TestExitQuotesBoundedOutput(t *testing.T) {
	dir := t.TempDir()
	// A VMM executable that is only a shell script: it writes 200 numbered
	// lines and fails before ready.
	exe := filepath.Join(dir, "noisy-vmm")
	script := "#!/bin/sh\ni=0\nwhile [ $i -lt 200 ]; do i=$((i+1)); echo \"noisy vmm line $i of 200\" >&2; done\nexit 3\n"
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := fileSpec(filepath.Join(dir, "memory"), layout.Single(testMemoryBytes))
	spec.RuntimeDir = filepath.Join(dir, "run")
	if err := os.Mkdir(spec.RuntimeDir, 0o700); err != nil {
		t.Fatal(err)
	}
	inst := start(t, t.Context(), &VMM{Exe: exe, TracePath: filepath.Join(dir, "trace")}, spec)
	_, err := inst.WaitReady(t.Context())
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("WaitReady: %v, want ErrExited with exit status 3", err)
	}
	_, quoted, ok := strings.Cut(err.Error(), "last output: ")
	if !ok {
		t.Fatalf("WaitReady: %v, want the last output quoted", err)
	}
	if len(quoted) > outputQuoteBytes || len(quoted) < outputQuoteBytes/2 {
		t.Errorf("quoted %d bytes of output, want at most %d and more than half: %q", len(quoted), outputQuoteBytes, quoted)
	}
	lines := strings.Split(quoted, " | ")
	if !strings.HasPrefix(lines[0], "noisy vmm line ") || lines[len(lines)-1] != "noisy vmm line 200 of 200" {
		t.Errorf("quoted output %q does not run in whole lines to the last", quoted)
	}
	if strings.Contains(err.Error(), spec.RuntimeDir) {
		t.Errorf("WaitReady: %v names the runtime directory, which the restore removes", err)
	}
	// The log itself holds all of it while the runtime directory exists.
	log, readErr := os.ReadFile(filepath.Join(spec.RuntimeDir, LogFile))
	if readErr != nil || !strings.HasPrefix(string(log), fmt.Sprintln("noisy vmm line 1 of 200")) {
		t.Errorf("log %q (%v), want every line", log, readErr)
	}
}
