package main

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"warmstart/internal/lab/synth"
)

// TestRestoreJSONOneSchema restores the same snapshot in process and on a
// daemon with --json: both print one document with the same keys, snake
// case, numbers as JSON numbers and the phase timings in integer
// nanoseconds (keys ending in _ns).
func TestRestoreJSONOneSchema(t *testing.T) {
	dir, err := os.MkdirTemp("", "wsj-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ref, err := synth.Generate(context.Background(), synth.Options{MemoryBytes: 8 << 20, Seed: 5, Dir: filepath.Join(dir, "ref")})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(ref.Layout)
	if err != nil {
		t.Fatal(err)
	}
	cfg := replayDaemonConfig(dir, ref.Trace)
	serveDaemon(t, cfg, "")
	sock := cfg.Daemon.Socket
	if _, _, err := runVerb(t, "--daemon", sock, "snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory,
		"--alias", "web", "--layout", strings.TrimSpace(string(spec))); err != nil {
		t.Fatalf("import: %v", err)
	}

	onDaemon, _, err := runVerb(t, "--daemon", sock, "restore", "web", "--json")
	if err != nil {
		t.Fatalf("restore --daemon --json: %v", err)
	}
	cliConfig := filepath.Join(dir, "cli.toml")
	text := "[runtime]\ndir = \"" + filepath.Join(dir, "clirun") + "\"\n[backend.posix_fs]\nsnapshot_store = \"" + cfg.Backend.PosixFS.SnapshotStore + "\"\n"
	if err := os.WriteFile(cliConfig, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	inProcess, _, err := runVerb(t, "--config", cliConfig, "restore", "--vmm", "replay", "--trace", ref.Trace, "web", "--json")
	if err != nil {
		t.Fatalf("restore --json in process: %v", err)
	}

	// The CLI reads [vmm] driver and [replay] trace as the daemon does:
	// without --vmm and --trace it restores with the configured replay VMM.
	text += "[vmm]\ndriver = \"replay\"\n[replay]\ntrace = \"" + ref.Trace + "\"\n"
	if err := os.WriteFile(cliConfig, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	fromConfig, _, err := runVerb(t, "--config", cliConfig, "restore", "web", "--json")
	if err != nil {
		t.Fatalf("restore --json with [vmm] driver and [replay] trace from the configuration: %v", err)
	}
	decodeRestoreJSON(t, "configured VMM", fromConfig)

	a, b := decodeRestoreJSON(t, "--daemon", onDaemon), decodeRestoreJSON(t, "in process", inProcess)
	if ka, kb := slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b)); !slices.Equal(ka, kb) {
		t.Errorf("keys differ: --daemon %v, in process %v", ka, kb)
	}
	for _, want := range []string{"id", "snapshot", "device", "policy", "io_engine", "started_at", "timings"} {
		if _, ok := b[want]; !ok {
			t.Errorf("in-process restore --json lacks %q: %s", want, inProcess)
		}
	}
}

// decodeRestoreJSON decodes a restore document and checks its form: snake
// case keys, numbers as numbers, timings in _ns, started_at a time.
func decodeRestoreJSON(t *testing.T, mode, out string) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%s: restore printed %q: %v", mode, out, err)
	}
	for _, k := range []string{"io_engine", "generation"} {
		if _, ok := doc[k].(float64); !ok {
			t.Errorf("%s: %s = %#v, want a number", mode, k, doc[k])
		}
	}
	timings, _ := doc["timings"].(map[string]any)
	if len(timings) == 0 {
		t.Errorf("%s: timings = %#v", mode, doc["timings"])
	}
	for k, v := range timings {
		if _, ok := v.(float64); !ok || !strings.HasSuffix(k, "_ns") {
			t.Errorf("%s: timings.%s = %#v, want a number of nanoseconds in a key ending _ns", mode, k, v)
		}
	}
	if s, _ := doc["started_at"].(string); s == "" {
		t.Errorf("%s: started_at = %#v", mode, doc["started_at"])
	} else if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
		t.Errorf("%s: started_at %q: %v", mode, s, err)
	}
	for k := range doc {
		if strings.ToLower(k) != k || strings.Contains(k, "-") {
			t.Errorf("%s: key %q is not snake case", mode, k)
		}
	}
	return doc
}
