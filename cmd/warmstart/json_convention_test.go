package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/api/apitest"
	"warmstart/internal/daemon"
	"warmstart/internal/layout"
	"warmstart/internal/manifest"
)

// jsonVerb is one verb run with --json: its arguments (without --daemon or
// --config) and the schema its stdout must match.
type jsonVerb struct {
	args   []string
	schema string
	array  bool
	// local: run in process only (the verb has no --daemon mode).
	local bool
}

// TestJSONConvention runs every verb that has --json, in process and with
// --daemon where it has both, and checks its stdout against its schema in
// openapi.json and against the JSON convention (docs/json.md): typed
// values, durations in integer _ns, every key described, and state
// "stopped" once a verb stopped the restore it started.
func TestJSONConvention(t *testing.T) {
	dir, cfg, ref := replayDaemonWithWeb(t, "wsjc-", 7)
	sock := cfg.Daemon.Socket
	local := filepath.Join(dir, "cli.toml")
	text := "[runtime]\ndir = \"" + filepath.Join(dir, "clirun") + "\"\n[backend.posix_fs]\nsnapshot_store = \"" +
		cfg.Backend.PosixFS.SnapshotStore + "\"\n[vmm]\ndriver = \"replay\"\n[replay]\ntrace = \"" + ref.Trace + "\"\n"
	if err := os.WriteFile(local, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(ref.Layout)
	if err != nil {
		t.Fatal(err)
	}
	manifestFile := writeTestManifest(t, dir, strings.TrimSpace(string(spec)), 8<<20)
	keyPrefix := filepath.Join(dir, "signer")
	if _, _, err := runVerb(t, "key", "generate", "--out", keyPrefix); err != nil {
		t.Fatalf("key generate: %v", err)
	}

	schemas := apitest.LoadSchemas(t, daemon.OpenAPI())
	for _, v := range []jsonVerb{
		{args: []string{"restore", "web"}, schema: "RestoreInfo"},
		{args: []string{"snapshot", "list"}, schema: "Record", array: true},
		{args: []string{"snapshot", "show", "web"}, schema: "SnapshotInfo"},
		{args: []string{"snapshot", "verify", "web"}, schema: "VerifyReport"},
		{args: []string{"manifest", "inspect", manifestFile}, schema: "ManifestInspection", local: true},
		{args: []string{"key", "show", keyPrefix + ".pub"}, schema: "KeyInfo", local: true},
	} {
		modes := map[string][]string{"in process": {"--config", local}}
		if !v.local {
			modes["--daemon"] = []string{"--daemon", sock}
		}
		for mode, flags := range modes {
			what := strings.Join(v.args, " ") + " --json (" + mode + ")"
			out, stderr, err := runVerb(t, append(append(flags, v.args...), "--json")...)
			if err != nil {
				t.Fatalf("%s: %v\n%s", what, err, stderr)
			}
			schemas.Check(t, what, v.schema, []byte(out), v.array)
			if v.args[0] == "restore" {
				checkStopped(t, what, out)
			}
		}
	}
	checkHeldListed(t, schemas, sock)
}

// checkStopped: a restore the verb stopped says so, with its stop report.
func checkStopped(t *testing.T, what, out string) {
	t.Helper()
	var doc struct {
		State string          `json:"state"`
		Stop  json.RawMessage `json:"stop"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.State != "stopped" || len(doc.Stop) == 0 {
		t.Errorf("%s: state %q, stop %s after the verb stopped the restore; want stopped and the stop report", what, doc.State, doc.Stop)
	}
}

// checkHeldListed: a restore the daemon holds reads "running", in
// restore --hold's answer and in restores list; both match the schema.
func checkHeldListed(t *testing.T, schemas apitest.Schemas, sock string) {
	t.Helper()
	out, stderr, err := runVerb(t, "--daemon", sock, "restore", "web", "--hold", "--json")
	if err != nil {
		t.Fatalf("restore --hold --json: %v\n%s", err, stderr)
	}
	schemas.Check(t, "restore --hold --json (--daemon)", "RestoreInfo", []byte(out), false)
	var held struct {
		ID    string `json:"id"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &held); err != nil || held.State != "running" {
		t.Errorf("restore --hold --json: state %q (%v), want running", held.State, err)
	}
	list, _, err := runVerb(t, "--daemon", sock, "restores", "list", "--json")
	if err != nil {
		t.Fatalf("restores list --json: %v", err)
	}
	schemas.Check(t, "restores list --json (--daemon)", "RestoreInfo", []byte(list), true)
	if !strings.Contains(list, held.ID) {
		t.Errorf("restores list --json lacks the held restore %s: %s", held.ID, list)
	}
	if _, _, err := runVerb(t, "--daemon", sock, "restores", "stop", held.ID); err != nil {
		t.Errorf("restores stop: %v", err)
	}
}

// writeTestManifest writes a startup manifest of two ranges over the
// layout spec of a memory file of size bytes.
func writeTestManifest(t *testing.T, dir, spec string, size int64) string {
	t.Helper()
	l, err := layout.Parse(spec, size)
	if err != nil {
		t.Fatal(err)
	}
	data, err := manifest.Encode(&manifest.Manifest{Layout: l, Ranges: []manifest.Range{{Offset: 8192, Length: 4096}, {Offset: 0, Length: 4096}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "startup.manifest")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
