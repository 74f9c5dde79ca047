package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestJSONFailureIsOneDocument runs verbs that fail with --json — usage
// errors, a snapshot that does not exist, a store or daemon that is not
// there — and checks that stdout still holds one JSON document a script can
// parse: the error and the exit status, the same as on stderr.
func TestJSONFailureIsOneDocument(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := noRecordingConfig(t)
	cases := [][]string{
		{"restore", "nope", "--json", "--store", store},
		{"restore", "nope", "--json", "--device", "bogus", "--store", store},
		{"restore", "--json", "--store", store},
		{"restore", "nope", "--json", "--bogus-flag"},
		{"snapshot", "show", "nope", "--json", "--store", store},
		{"snapshot", "verify", "nope", "--json", "--store", store},
		{"snapshot", "list", "--json", "--store", filepath.Join(dir, "absent")},
		{"restores", "list", "--json", "--daemon", filepath.Join(dir, "no.sock")},
	}
	for _, args := range cases {
		r := runCLI(t, append([]string{"--config", cfg}, args...)...)
		name := strings.Join(args, " ")
		if r.code == 0 {
			t.Errorf("%s: exit 0, want a failure", name)
			continue
		}
		var doc struct {
			Error    string `json:"error"`
			ExitCode *int   `json:"exit_code"`
		}
		dec := json.NewDecoder(strings.NewReader(r.stdout))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&doc); err != nil {
			t.Errorf("%s: exit %d, stdout %q is no JSON document: %v (stderr %q)", name, r.code, r.stdout, err, r.stderr)
			continue
		}
		if dec.More() {
			t.Errorf("%s: stdout holds more than one JSON value: %q", name, r.stdout)
		}
		if doc.Error == "" || !strings.Contains(r.stderr, doc.Error) {
			t.Errorf("%s: JSON error %q is not the error on stderr %q", name, doc.Error, r.stderr)
		}
		if doc.ExitCode == nil || *doc.ExitCode != r.code {
			t.Errorf("%s: JSON exit_code %v, process exited %d", name, doc.ExitCode, r.code)
		}
	}
}
