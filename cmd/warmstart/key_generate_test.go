package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKeyGenerateRefusesADirectoryAsPrefix: --out names a prefix, the
// files are PREFIX.key and PREFIX.pub. "--out /etc/warmstart/" wrote the
// hidden files /etc/warmstart/.key and .pub, and "--out DIR" of an
// existing directory DIR.key beside it: both are bad usage (exit 2) that
// says to give a name in the directory, and nothing is written.
func TestKeyGenerateRefusesADirectoryAsPrefix(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	if err := os.Mkdir(keys, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{keys + "/", keys, keys + "/.", keys + "/.."} {
		r := runCLI(t, "key", "generate", "--out", out)
		if r.code != 2 || !strings.Contains(r.stderr, "directory") || !strings.Contains(r.stderr, "publisher") {
			t.Errorf("--out %s: exit %d, stderr %q; want exit 2 saying it names a directory and how to name the key", out, r.code, r.stderr)
		}
	}
	for _, d := range []string{dir, keys} {
		if left, _ := os.ReadDir(d); len(left) != map[string]int{dir: 1, keys: 0}[d] {
			t.Errorf("%s holds %d entries after refused generates", d, len(left))
		}
	}
}
