package main

import (
	"strings"
	"testing"
)

// TestLocalOnlyVerbsHideDaemonInHelp: snapshot sign and snapshot flatten
// refuse --daemon, so their help must not offer it; their siblings still
// do, and the flag, if given anyway, is still refused as a usage error.
func TestLocalOnlyVerbsHideDaemonInHelp(t *testing.T) {
	for _, verb := range []string{"sign", "flatten"} {
		r := runCLI(t, "snapshot", verb, "--help")
		if r.code != 0 || strings.Contains(r.stdout, "--daemon address") {
			t.Errorf("snapshot %s --help: exit %d, lists --daemon:\n%s", verb, r.code, r.stdout)
		}
		r = runCLI(t, "snapshot", verb, "--daemon", "unix:/nonexistent", "x")
		if r.code != 2 || !strings.Contains(r.stderr, "no --daemon") {
			t.Errorf("snapshot %s --daemon: exit %d, stderr %q; want exit 2 refusing --daemon", verb, r.code, r.stderr)
		}
	}
	if r := runCLI(t, "snapshot", "verify", "--help"); r.code != 0 || !strings.Contains(r.stdout, "--daemon address") {
		t.Errorf("snapshot verify --help: exit %d, does not list --daemon:\n%s", r.code, r.stdout)
	}
}
