package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoDaemonErrorNamesTheVerbOnce: main prefixes every error with the
// program's name, so an error names the verb without it. "restores list"
// with no daemon on the configured socket said "warmstart: warmstart
// restores list needs a daemon", in its --json "error" field too.
func TestNoDaemonErrorNamesTheVerbOnce(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "warmstart.toml")
	body := "[daemon]\nsocket = \"" + filepath.Join(dir, "absent.sock") + "\"\n"
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--config", cfg, "restores", "list"},
		{"--config", cfg, "restores", "list", "--json"},
	} {
		r := runCLI(t, args...)
		out := r.stderr + r.stdout
		if r.code != 1 || !strings.Contains(out, "restores list needs a daemon") || strings.Contains(out, "warmstart restores list") {
			t.Errorf("%q: exit %d, output %q; want exit 1 naming \"restores list\" once, without the program's name again",
				args, r.code, out)
		}
	}
}
