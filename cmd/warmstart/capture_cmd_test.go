package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"warmstart/internal/lab/bench"
	"warmstart/internal/vmm/qemu"
)

// runGuestVerb runs "warmstart ARGS..." in this process and returns its stdout
// and error. Flag values live in variables that outlive a run, so every
// flag of every verb is reset to its default first.
func runGuestVerb(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var reset func(c *cobra.Command)
	reset = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				_ = f.Value.Set(f.DefValue)
				f.Changed = false
			})
		}
		for _, sub := range c.Commands() {
			reset(sub)
		}
	}
	reset(rootCmd)
	var stdout, stderr bytes.Buffer
	rootCmd.SetOut(&stdout)
	rootCmd.SetErr(&stderr)
	rootCmd.SetArgs(args)
	t.Cleanup(func() { rootCmd.SetOut(nil); rootCmd.SetErr(nil); rootCmd.SetArgs(nil) })
	err := rootCmd.ExecuteContext(context.Background())
	if err != nil {
		t.Logf("warmstart %s: stderr:\n%s", strings.Join(args, " "), stderr.String())
	}
	return stdout.String(), err
}

// TestRealGuestVerbs captures the real guest with recording enabled, then
// restores it with prefetch through the FUSE device and runs one block of
// the benchmark protocol on it: the whole path an operator takes.
func TestRealGuestVerbs(t *testing.T) {
	requireRealGuest(t)
	dir, cfg := writeGuestConfig(t)
	captured := captureGuestVerb(t, cfg)
	restoreGuestVerb(t, cfg, captured)
	benchGuestVerb(t, cfg, filepath.Join(dir, "bench.json"), captured.Token)
}

// requireRealGuest skips the test where QEMU or a kernel is missing,
// except on CI, which must run it.
func requireRealGuest(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath(qemu.DefaultBinary); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI must run the real-guest tests: %v", err)
		}
		t.Skipf("no real guest here: %v", err)
	}
	if m, _ := filepath.Glob(qemu.KernelGlob); len(m) == 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI must run the real-guest tests: no kernel at %s", qemu.KernelGlob)
		}
		t.Skipf("no real guest here: no kernel at %s", qemu.KernelGlob)
	}
}

// writeGuestConfig writes, in a short temporary root, a configuration
// that records and consumes startup manifests; it returns the root and
// the configuration's path.
func writeGuestConfig(t *testing.T) (string, string) {
	t.Helper()
	// A short root: the guest's sockets live under the runtime directory.
	dir, err := os.MkdirTemp("", "wscli-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(`
[snapshot.memory_startup_pack]
enabled = true
consume_enabled = true

[backend.posix_fs]
snapshot_store = "`+filepath.Join(dir, "store")+`"

[runtime]
dir = "`+filepath.Join(dir, "run")+`"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, cfg
}

// capturedGuest is what "capture --json" prints, as far as the test reads it.
type capturedGuest struct {
	ID       string
	Accel    string
	Token    string
	Manifest *struct {
		Bytes  int64
		Ranges int
	}
	ManifestError string `json:"manifest_error"`
}

// captureGuestVerb captures the real guest as alias guest and checks a
// manifest was attached and the guest drew a token.
func captureGuestVerb(t *testing.T, cfg string) capturedGuest {
	t.Helper()
	out, err := runGuestVerb(t, "--config", cfg, "capture", "--vmm", "qemu", "--alias", "guest", "--json")
	if err != nil {
		t.Fatalf("capture: %v", err)
	}
	var captured capturedGuest
	if err := json.Unmarshal([]byte(out), &captured); err != nil {
		t.Fatalf("capture printed %q: %v", out, err)
	}
	if captured.Manifest == nil || captured.Manifest.Bytes == 0 || captured.ManifestError != "" {
		t.Fatalf("capture with recording enabled attached no manifest: %s", out)
	}
	if len(captured.Token) != 32 || captured.Accel == "" {
		t.Fatalf("capture reported token %q, accelerator %q", captured.Token, captured.Accel)
	}
	return captured
}

// restoreGuestVerb restores guest and checks it is the captured guest and
// that it prefetched the whole manifest.
func restoreGuestVerb(t *testing.T, cfg string, captured capturedGuest) {
	t.Helper()
	out, err := runGuestVerb(t, "--config", cfg, "restore", "--vmm", "qemu", "--json", "guest")
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	var restored struct {
		Snapshot string
		Prefetch struct {
			State        string
			PlannedBytes int64 `json:"planned_bytes"`
		}
		Ready map[string]string
	}
	if err := json.Unmarshal([]byte(out), &restored); err != nil {
		t.Fatalf("restore printed %q: %v", out, err)
	}
	if restored.Snapshot != captured.ID || restored.Ready["token"] != captured.Token {
		t.Errorf("restore of %s answered with token %q; captured %s drew %q", restored.Snapshot, restored.Ready["token"], captured.ID, captured.Token)
	}
	// consume_enabled is on and the manifest is valid: the restore prefetches.
	if restored.Prefetch.State == "skipped" || restored.Prefetch.PlannedBytes != captured.Manifest.Bytes {
		t.Errorf("restore prefetch %s of %d bytes; want the %d-byte manifest prefetched", restored.Prefetch.State, restored.Prefetch.PlannedBytes, captured.Manifest.Bytes)
	}
}

// benchGuestVerb runs one block of the benchmark on guest, writing its
// report to report, and checks every admitted trial met the captured guest.
func benchGuestVerb(t *testing.T, cfg, report, token string) {
	t.Helper()
	if _, err := runGuestVerb(t, "--config", cfg, "bench", "--vmm", "qemu", "--blocks", "1", "--reserve-blocks", "1", "--no-hot",
		"--policies", "seed", "--json", report, "guest"); err != nil {
		t.Fatalf("bench: %v", err)
	}
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Pilot == nil || rep.Pilot.Token != token {
		t.Errorf("bench pilot learned token %v, want %s", rep.Pilot, token)
	}
	// A trial whose cache state is not what its condition needs when the
	// timer would start (another process evicted or read the file) is not
	// admitted, and the reserve block runs it again.
	if want := 4; rep.Summary.Admitted != want || !rep.Summary.AllHashesOK || len(rep.Leaks) > 0 {
		t.Errorf("bench: %d trials, %d admitted, all checks passed %v, leaks %v; want %d admitted trials, all checked, no leaks",
			len(rep.Trials), rep.Summary.Admitted, rep.Summary.AllHashesOK, rep.Leaks, want)
	}
	for _, tr := range rep.Trials {
		if !tr.Admitted {
			continue
		}
		if tr.Token != token {
			t.Errorf("trial %s answered with token %q", tr.Spec.Condition, tr.Token)
		}
	}
}

// TestCaptureAgentWorkloadFlag: --agent-workload is checked before
// anything starts: malformed, or on a VMM whose guest has no such agent,
// it is a usage error naming the flag; well-formed, it replaces [qemu]
// agent_workload, whose bounds (half the guest's memory) then apply.
func TestCaptureAgentWorkloadFlag(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ws.toml")
	conf := "[runtime]\ndir = \"" + filepath.Join(dir, "run") + "\"\n[backend.posix_fs]\nsnapshot_store = \"" + filepath.Join(dir, "store") + "\"\n" +
		"[qemu]\nbinary = \"" + os.Args[0] + "\"\naccel = \"tcg\"\nagent_workload = \"heap_mib=4\"\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"--agent-workload", "heap=4"}, 2, `--agent-workload: invalid agent workload: unknown parameter "heap"`},
		{[]string{"--agent-workload", "heap_mib=4", "--vmm", "firecracker"}, 2, "--agent-workload: only the QEMU test guest's agent"},
		{[]string{"--agent-workload", "heap_mib=100"}, 1, "heap_mib=100 takes 100 MiB, more than half of the guest's 128 MiB"},
	} {
		r := runCLI(t, append([]string{"--config", cfg, "capture"}, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.says) {
			t.Errorf("capture %q: exit %d, %q; want %d saying %q", tc.args, r.code, r.stderr, tc.code, tc.says)
		}
	}
	if records, _ := os.ReadDir(filepath.Join(dir, "store", "catalog", "records")); len(records) > 0 {
		t.Errorf("refused captures published %d records", len(records))
	}
}
