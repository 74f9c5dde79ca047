package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/miniotest"
	"warmstart/internal/role"
	"warmstart/internal/s3bench"
	"warmstart/internal/vmm/replay"
)

func TestMain(m *testing.M) {
	// The benchmark's restores re-execute this test binary as the replay VMM.
	role.Roles{replay.RoleReplayVMM: replay.ChildMain}.Dispatch()
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}

// TestUsageErrors: flags no run can use are refused with exit status 2
// before anything starts.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--blocks", "0"}, "--blocks 0: want at least 1"},
		{[]string{"--memory-size", "lots"}, "--memory-size: bad size"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(c.args, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", c.args, code, stderr.String(), exitUsage, c.want)
		}
	}
}

// TestRun measures one block on a small reference snapshot: the table goes
// to stdout, the report to --json with every trial reading the right
// bytes, and the temporary directory is removed.
func TestRun(t *testing.T) {
	miniotest.Require(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	jsonPath := filepath.Join(t.TempDir(), "report.json")
	var stdout, stderr bytes.Buffer
	code := run([]string{"--blocks", "1", "--memory-size", "8MiB", "--policy", "seed", "--json", jsonPath}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "cold-cache/prefetch-on") || !strings.Contains(stdout.String(), "cold cache: prefetch on / off") {
		t.Errorf("no summary table on stdout:\n%s", stdout.String())
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep s3bench.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Trials) != len(s3bench.Conditions) || rep.Options.Policy != "seed" || rep.Options.MemoryBytes != 8<<20 {
		t.Fatalf("report has %d trials, policy %q, memory %d; want %d, seed, 8 MiB",
			len(rep.Trials), rep.Options.Policy, rep.Options.MemoryBytes, len(s3bench.Conditions))
	}
	for _, tr := range rep.Trials {
		if !tr.HashOK {
			t.Errorf("%s: the guest read wrong bytes", tr.Condition)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) > 0 {
		t.Errorf("left in TMPDIR: %v", left)
	}
}
