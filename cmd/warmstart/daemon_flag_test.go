package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// daemonVerbs are the runnable verbs that take --daemon, as argument paths
// below the root ("snapshot show").
func daemonVerbs(c *cobra.Command, path []string) [][]string {
	var verbs [][]string
	if c.Runnable() && (c.LocalFlags().Lookup("daemon") != nil || c.InheritedFlags().Lookup("daemon") != nil) {
		verbs = append(verbs, path)
	}
	for _, sub := range c.Commands() {
		verbs = append(verbs, daemonVerbs(sub, append(append([]string(nil), path...), sub.Name()))...)
	}
	return verbs
}

// An explicitly empty --daemon (an unset "$WARMSTART_DAEMON") is a usage
// error on every verb that has the flag: running the verb in process
// instead would hide the operator's mistake.
func TestEmptyDaemonIsAUsageError(t *testing.T) {
	verbs := daemonVerbs(rootCmd, nil)
	if len(verbs) < 5 {
		t.Fatalf("verbs with --daemon: %q; want restore, restores and the snapshot verbs", verbs)
	}
	// Were the verb to run in process anyway, it would use this test's
	// store, not the host's.
	dir := t.TempDir()
	configFile := filepath.Join(dir, "config.toml")
	toml := fmt.Sprintf("[backend.posix_fs]\nsnapshot_store = %q\n[runtime]\ndir = %q\n", filepath.Join(dir, "store"), filepath.Join(dir, "run"))
	if err := os.WriteFile(configFile, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, verb := range verbs {
		for _, form := range [][]string{{"--daemon", ""}, {"--daemon="}, {"--daemon", "  "}} {
			args := append(append([]string{"--config", configFile}, verb...), form...)
			res := runCLI(t, args...)
			if res.code != 2 || !strings.Contains(res.stderr, "--daemon") || !strings.Contains(res.stderr, "Unix socket") {
				t.Errorf("warmstart %q: exit %d, stderr %q; want exit 2 naming --daemon and what it wants", args, res.code, res.stderr)
			}
		}
	}
}

// "snapshot gc" inherits --daemon from "snapshot" but runs only in this
// process: given a daemon, it refuses rather than collect in process.
func TestGCRefusesDaemon(t *testing.T) {
	dir := t.TempDir()
	res := runCLI(t, "snapshot", "gc", "--store", filepath.Join(dir, "store"), "--daemon", filepath.Join(dir, "d.sock"))
	if res.code != 2 || !strings.Contains(res.stderr, "--daemon") {
		t.Fatalf("snapshot gc --daemon: exit %d, stderr %q; want exit 2 naming --daemon", res.code, res.stderr)
	}
}
