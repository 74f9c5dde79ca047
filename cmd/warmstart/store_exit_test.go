package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/cli"
	"warmstart/internal/lab/miniotest"
	"warmstart/internal/repository/s3"
)

// wantExit wants r to have exited code and its error on stderr to say
// each of says.
func wantExit(t *testing.T, what string, r cliRun, code int, says ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: exit %d, want %d (stderr %q)", what, r.code, code, r.stderr)
	}
	// The error is the last line; warnings before it do not count.
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	msg := lines[len(lines)-1]
	for _, s := range says {
		if !strings.Contains(msg, s) {
			t.Errorf("%s: error %q does not say %q", what, msg, s)
		}
	}
	if strings.Contains(r.stderr, "warning") {
		t.Errorf("%s: warned:\n%s", what, r.stderr)
	}
}

// wantJSONExit is wantExit for a verb run with --json, whose failure
// document must carry the same exit code and error.
func wantJSONExit(t *testing.T, what string, r cliRun, code int, says ...string) {
	t.Helper()
	wantExit(t, what, r, code, says...)
	var doc cli.Failure
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("%s: stdout %q is no failure document: %v", what, r.stdout, err)
	}
	if doc.ExitCode != code || !strings.Contains(r.stderr, doc.Error) {
		t.Fatalf("%s: failure document %+v, want exit_code %d and the error on stderr", what, doc, code)
	}
}

// mountReadOnly bind-mounts dir read-only at target (made) until t ends,
// and skips t when it cannot.
func mountReadOnly(t *testing.T, dir, target string) {
	t.Helper()
	if err := os.MkdirAll(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, target, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount %s on %s: %v (a read-only store needs a mount of its own)", dir, target, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(target, 0); err != nil {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
	if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Skipf("remount %s read-only: %v", target, err)
	}
}

// TestStoreThatTakesNoWritesExits5: an import into a store on a read-only
// mount, or on a full disk, exits 5 (the daemon's 507), in process and
// through a daemon, and its error names the store. The read-only store
// still lists, without a warning.
func TestStoreThatTakesNoWritesExits5(t *testing.T) {
	root := importedCLIRoot(t, "wsro5-", 11, "base")
	ref := root.ref
	ro := filepath.Join(root.dir, "ro")
	mountReadOnly(t, filepath.Join(root.dir, "store"), ro)
	imp := []string{"--config", root.cfg, "snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory,
		"--layout", root.layout, "--alias", "two"}

	r := runCLI(t, append(imp, "--store", ro)...)
	wantExit(t, "import into a read-only store", r, cli.ExitCannotStore, "snapshot store "+ro, "read-only")
	if r := runCLI(t, "--config", root.cfg, "snapshot", "list", "--store", ro); r.code != 0 ||
		!strings.Contains(r.stdout, "base") || strings.Contains(r.stderr, "warning") {
		t.Fatalf("list of a read-only store: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	cfg := replayDaemonConfig(root.dir, ref.Trace)
	cfg.Backend.PosixFS.SnapshotStore = ro
	serveDaemon(t, cfg, "")
	r = runCLI(t, append(imp, "--daemon", cfg.Daemon.Socket)...)
	wantExit(t, "import into a read-only store through a daemon", r, cli.ExitCannotStore, "snapshot store "+ro, "HTTP 507")

	full := filepath.Join(root.dir, "full")
	if err := os.MkdirAll(full, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", full, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("mount a small tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(full, 0) })
	r = runCLI(t, append(imp, "--store", full)...)
	wantExit(t, "import into a full store", r, cli.ExitCannotStore, "no space left")
}

// closedAddr is a local address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestUnreachableStoreExits6: a verb whose S3 store does not answer exits
// 6 (the daemon's 503), in process and through a daemon whose store
// stopped answering.
func TestUnreachableStoreExits6(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "s3.toml")
	text := fmt.Sprintf("[snapshot]\nrepository_backend = \"s3\"\n[backend.s3]\nendpoint = %q\nbucket = \"gone\"\n"+
		"region = \"us-east-1\"\naddressing_style = \"path\"\naccess_key_id = \"k\"\nsecret_access_key = \"secret-key\"\ncache_dir = %q\n",
		"http://"+closedAddr(t), filepath.Join(dir, "cache"))
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, "--config", cfg, "snapshot", "list", "--json")
	wantJSONExit(t, "list of an unreachable store", r, cli.ExitUnavailable, "the store is unreachable")

	srv := miniotest.Start(t)
	if err := srv.MakeBucket(context.Background(), "down"); err != nil {
		t.Fatal(err)
	}
	repo, err := s3.Open(context.Background(), s3.Options{
		Endpoint: "http://" + srv.Endpoint, Bucket: "down", Region: "us-east-1", AddressingStyle: "path",
		AccessKeyID: miniotest.AccessKey, SecretAccessKey: miniotest.SecretKey, CacheDir: t.TempDir(), CacheMaxBytes: 64 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { repo.Close() })
	root := newCLIRoot(t, "ws6-", 12) // a short path for the socket
	dcfg := replayDaemonConfig(root.dir, root.ref.Trace)
	serveDaemonOf(t, dcfg, "", repo)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, "snapshot", "list", "--json", "--daemon", dcfg.Daemon.Socket)
	wantJSONExit(t, "list through a daemon whose store is down", r, cli.ExitUnavailable, "HTTP 503")
}
