package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"warmstart/internal/lab/synth"
	"warmstart/internal/trace"
)

// TestReplayVMMFailureQuotesItsLog runs "warmstart restore" with a replay
// VMM that fails before ready: its runtime directory, where the VMM's log
// was, is removed by the time the error is printed, so the error must
// carry what the log said and name no file that is gone.
func TestReplayVMMFailureQuotesItsLog(t *testing.T) {
	cfg, run, _ := restoreFixture(t)
	dir := filepath.Dir(cfg)
	ref, err := synth.Generate(context.Background(), synth.Options{MemoryBytes: 16 << 20, Seed: 3, Dir: filepath.Join(dir, "ref")})
	if err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, "--config", cfg, "snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory,
		"--alias", "web", "--layout", "0:16MiB"); r.code != 0 {
		t.Fatalf("import: exit %d, stderr %q", r.code, r.stderr)
	}
	// A well-formed trace the VMM refuses once it knows the layout.
	outside := filepath.Join(dir, "outside.trace")
	if err := trace.WriteFile(outside, []trace.Entry{{Offset: 1 << 30}}); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, "--config", cfg, "restore", "web", "--trace", outside)
	// "replay-vmm: " starts the line the VMM wrote to its output, its log.
	if r.code != 1 || !strings.Contains(r.stderr, "replay-vmm: trace "+outside) || !strings.Contains(r.stderr, "outside the memory layout") {
		t.Fatalf("restore with a failing VMM: exit %d, stderr %q; want exit 1 quoting the VMM's log", r.code, r.stderr)
	}
	named := map[string]bool{}
	for _, p := range regexp.MustCompile(regexp.QuoteMeta(dir)+`/[^\s;:|"']*`).FindAllString(r.stderr, -1) {
		if _, err := os.Stat(p); err != nil && !named[p] {
			t.Errorf("the error names %s, which does not exist after the command returned (%v); stderr %q", p, err, r.stderr)
		}
		named[p] = true
	}
	if entries, _ := os.ReadDir(run); len(entries) != 0 {
		t.Errorf("runtime directory %s holds %d entries after the command, want none", run, len(entries))
	}
}
