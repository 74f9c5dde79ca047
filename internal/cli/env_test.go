package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"
)

// TestConfigIsLoadedOncePerRun: every part of a verb that asks for the
// configuration gets the one loaded at its first call, even after the
// file changed; the next run of a verb loads it afresh.
func TestConfigIsLoadedOncePerRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	write := func(level string) {
		if err := os.WriteFile(path, []byte("[log]\nlevel = \""+level+"\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("debug")
	var e Env
	root := &cobra.Command{Use: "root", RunE: func(*cobra.Command, []string) error { return nil }}
	e.Register(root)
	root.SetArgs([]string{"--config", path})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	first, err := e.Config()
	if err != nil || first.Log.Level != "debug" {
		t.Fatalf("first load: %+v, %v", first, err)
	}
	write("error")
	if again, err := e.Config(); err != nil || again != first {
		t.Fatalf("second call in the same run loaded again: %p, was %p (%v)", again, first, err)
	}
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if next, err := e.Config(); err != nil || next.Log.Level != "error" {
		t.Fatalf("the next run kept the earlier configuration: %+v, %v", next, err)
	}
}
