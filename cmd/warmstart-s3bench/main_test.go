package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"warmstart/internal/lab/miniotest"
	"warmstart/internal/lab/s3bench"
	"warmstart/internal/reexec"
	"warmstart/internal/vmm/replay"
)

func TestMain(m *testing.M) {
	// The benchmark's restores re-execute this test binary as the replay VMM.
	reexec.Roles{replay.RoleReplayVMM: replay.ChildMain}.Dispatch()
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
		{[]string{"--blocks", "0"}, "--blocks 0: want 1 to 1000"},
		{[]string{"--blocks", "1001"}, "--blocks 1001: want 1 to 1000"},
		{[]string{"--memory-size", "lots"}, "--memory-size: bad size"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"--conditions", "cold-on,lukewarm-on"}, `--conditions: condition "lukewarm-on"`},
		{[]string{"--warm-runs", "-1"}, "--warm-runs -1 and --warm-run-kib 0: want 0 (the default) or more"},
		{[]string{"--readaround-kib", "6"}, "--readaround-kib 6, --prefetch-readaround-kib 0: config: key memory.readaround_kib: 6 is not a whole number"},
		{[]string{"--prefetch-readaround-kib", "4096"}, "--readaround-kib 0, --prefetch-readaround-kib 4096: config: key memory.prefetch_readaround_kib: 4096 out of range"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(c.args, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", c.args, code, stderr.String(), exitUsage, c.want)
		}
	}
}

// TestConditionsFlag: --conditions picks the conditions each block runs,
// and the warm flags reach the cache prefetch.
func TestConditionsFlag(t *testing.T) {
	c, err := parseFlags([]string{"--conditions", "cold-on,warm-on", "--warm-runs", "6", "--warm-run-kib", "2048"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []s3bench.Condition{{Cache: s3bench.CacheCold, Prefetch: s3bench.PrefetchOn}, {Cache: s3bench.CacheWarm, Prefetch: s3bench.PrefetchOn}}
	if !reflect.DeepEqual(c.opts.Conditions, want) || c.opts.Warm.Concurrency != 6 || c.opts.Warm.RunCapBytes != 2<<20 {
		t.Fatalf("conditions %v, warm %+v", c.opts.Conditions, c.opts.Warm)
	}
}

// TestRun measures one block on a small reference snapshot: the table goes
// to stdout, the report to --json with every trial reading the right
// bytes, the node mounts with the readaround windows asked for, and the
// temporary directory is removed.
func TestRun(t *testing.T) {
	miniotest.Require(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	jsonPath := filepath.Join(t.TempDir(), "report.json")
	var stdout, stderr bytes.Buffer
	code := run([]string{"--blocks", "1", "--memory-size", "8MiB", "--policy", "seed", "--json", jsonPath,
		"--readaround-kib", "64", "--prefetch-readaround-kib", "8"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "readaround 64 KiB without prefetch, 8 KiB with it") {
		t.Errorf("the node did not mount with the windows asked for:\n%s", stderr.String())
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
	if rep.Options.ReadaroundKiB != 64 || rep.Options.PrefetchReadaroundKiB != 8 {
		t.Errorf("report options %+v: want the readaround windows 64 and 8 KiB", rep.Options)
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
