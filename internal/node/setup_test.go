package node_test

import (
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/repository/posixfs"
)

// needFUSE skips a test that mounts a FUSE device on a host without one.
func needFUSE(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("FUSE mounts need /dev/fuse: %v", err)
	}
}

// nodeDir is a directory for a node's test, with a POSIX repository at
// its "store" (opened with opts) beside where the node's runtime
// directory goes.
func nodeDir(t testing.TB, opts posixfs.Options) (string, *posixfs.Repo) {
	t.Helper()
	dir := t.TempDir()
	repo, err := posixfs.Open(filepath.Join(dir, "store"), opts)
	if err != nil {
		t.Fatal(err)
	}
	return dir, repo
}
