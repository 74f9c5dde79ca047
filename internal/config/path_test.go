package config

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPath: --config wins, then $WARMSTART_CONFIG, then SystemFile when it
// exists, else the built-in defaults ("").
func TestPath(t *testing.T) {
	dir := t.TempDir()
	system := filepath.Join(dir, "config.toml")
	old := SystemFile
	SystemFile = system
	t.Cleanup(func() { SystemFile = old })

	t.Setenv(EnvFile, "")
	if got := Path(""); got != "" {
		t.Errorf("nothing set, no system file: %q, want the defaults", got)
	}
	if err := os.WriteFile(system, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := Path(""); got != system {
		t.Errorf("system file present: %q, want %q", got, system)
	}
	t.Setenv(EnvFile, "/from/env.toml")
	if got := Path(""); got != "/from/env.toml" {
		t.Errorf("%s set: %q", EnvFile, got)
	}
	if got := Path("/from/flag.toml"); got != "/from/flag.toml" {
		t.Errorf("--config given: %q", got)
	}
}
