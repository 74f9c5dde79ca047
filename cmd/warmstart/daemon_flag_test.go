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
			if res.code != 2 || !strings.Contains(res.stderr, "--daemon") || !strings.Contains(res.stderr, "socket") {
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

// A --daemon URL the CLI cannot talk to is a usage error naming the
// mistake: another scheme, or a URL that does not parse (not a missing
// token file, which is what dialling it would report).
func TestDaemonURLMistakesAreUsageErrors(t *testing.T) {
	// Dialling would look for the token file; keep it inside the test.
	dir := t.TempDir()
	configFile := filepath.Join(dir, "config.toml")
	toml := fmt.Sprintf("[daemon]\ntoken_file = %q\n", filepath.Join(dir, "token"))
	if err := os.WriteFile(configFile, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ value, want string }{
		{"ftp://x", `scheme "ftp"`},
		{"http://[::1", "malformed URL"},
		{"https://", "no host"},
	} {
		res := runCLI(t, "--config", configFile, "restores", "list", "--daemon", c.value)
		if res.code != 2 || !strings.Contains(res.stderr, "--daemon") || !strings.Contains(res.stderr, c.want) {
			t.Errorf("--daemon %s: exit %d, stderr %q; want exit 2 naming --daemon and %q", c.value, res.code, res.stderr, c.want)
		}
	}
}
