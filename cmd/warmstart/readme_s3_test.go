package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/lab/miniotest"
	"warmstart/internal/lab/synth"
	"warmstart/internal/vmm"
)

// readmeBlock returns the first fenced block of README.md's section
// headed heading, line by line.
func readmeBlock(t *testing.T, heading string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", heading)
	}
	_, fenced, ok := strings.Cut(section, "\n```\n")
	if !ok {
		t.Fatalf("README.md's section %q has no fenced block", heading)
	}
	block, _, ok := strings.Cut(fenced, "\n```\n")
	if !ok {
		t.Fatalf("README.md's section %q: the block does not end", heading)
	}
	return strings.Split(block, "\n")
}

// freePort is a TCP port on 127.0.0.1 nothing listened on a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestREADMES3Block runs README.md's "S3 in five minutes" block as
// written, bucket creation included, with only MinIO's path and port
// replaced, on the reference snapshot the quick start synthesizes; then,
// with the same MinIO, restores the snapshot warm (the node cache the
// block filled) and cold (an empty cache), and checks the guest read
// exactly the published memory both times.
func TestREADMES3Block(t *testing.T) {
	miniotest.Require(t)
	minioBin, err := miniotest.Find()
	if err != nil {
		t.Fatal(err)
	}
	ws, err := os.MkdirTemp("", "wsr-") // short: sockets live under $WS/run
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, m := range mountPointsBelow(t, filepath.Join(ws, "run")) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
		os.RemoveAll(ws)
	})
	ref, err := synth.Generate(context.Background(), synth.Options{MemoryBytes: 16 << 20, Seed: 5, Dir: filepath.Join(ws, "ref")})
	if err != nil {
		t.Fatal(err)
	}
	want := expectedHash(t, ref)
	script := readmeScript(t, minioBin, freePort(t))
	bin := t.TempDir() // holds ./warmstart: this test binary as the CLI
	wrapper := fmt.Sprintf("#!/bin/sh\nexec %q \"$@\"\n", os.Args[0])
	if err := os.WriteFile(filepath.Join(bin, "warmstart"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = bin
	cmd.Env = cliEnv("GORACE=atexit_sleep_ms=0", "WS="+ws)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	// Whatever happened, nothing the block started outlives the test.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if err != nil {
		t.Fatalf("README's S3 block: %v\n%s", err, out)
	}
	var results [2]struct {
		Ready    vmm.ReadyDetail `json:"ready"`
		Prefetch struct {
			State string `json:"state"`
		} `json:"prefetch"`
	}
	for i, name := range []string{"warm.json", "cold.json"} {
		b, err := os.ReadFile(filepath.Join(ws, name))
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if err := json.Unmarshal(b, &results[i]); err != nil {
			t.Fatalf("%s: %v: %s", name, err, b)
		}
		if got := results[i].Ready.SHA256; got != want {
			t.Errorf("%s restore: the guest read sha256 %s, want %s\n%s", name, got, want, out)
		}
		if results[i].Prefetch.State == "skipped" {
			t.Errorf("%s restore did not prefetch the manifest import recorded\n%s", name, out)
		}
	}
}

// readmeScript is the README's S3 block with MinIO's binary and port
// replaced, stopped before its last line (kill $MINIO_PID) to restore
// warm and then cold from the same MinIO, each restore's JSON kept in
// $WS; it stops MinIO on every way out.
func readmeScript(t *testing.T, minioBin string, port int) string {
	t.Helper()
	lines := readmeBlock(t, "S3 in five minutes")
	if lines[0] != "MINIO=$(bash .ci/minio.sh)" || lines[len(lines)-1] != "kill $MINIO_PID" {
		t.Fatalf("README's S3 block starts %q and ends %q; this test replaces the first and runs up to the last", lines[0], lines[len(lines)-1])
	}
	block := strings.Join(lines[1:len(lines)-1], "\n")
	if !strings.Contains(block, "store init") || strings.Contains(block, "curl -sSf") {
		t.Fatalf("README's S3 block should create the bucket with warmstart store init, not curl:\n%s", block)
	}
	block = strings.ReplaceAll(block, "127.0.0.1:9000", fmt.Sprintf("127.0.0.1:%d", port))
	return fmt.Sprintf(`set -euo pipefail
trap 'kill ${MINIO_PID:-} 2>/dev/null || true' EXIT
MINIO=%q
%s
./warmstart restore ref --json > $WS/warm.json
rm -rf $WS/cache
./warmstart restore ref --json > $WS/cold.json
`, minioBin, block)
}

// A missing bucket says to run store init; store init creates it once and
// leaves it as it is the next time.
func TestStoreInitCreatesTheBucket(t *testing.T) {
	srv := miniotest.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "s3.toml")
	text := fmt.Sprintf("[snapshot]\nrepository_backend = \"s3\"\n[backend.s3]\nendpoint = %q\nbucket = \"fresh\"\n"+
		"access_key_id = %q\nsecret_access_key = %q\ncache_dir = %q\n[runtime]\ndir = %q\n",
		"http://"+srv.Endpoint, miniotest.AccessKey, miniotest.SecretKey, filepath.Join(dir, "cache"), filepath.Join(dir, "run"))
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, "--config", cfg, "snapshot", "list"); r.code != 1 || !strings.Contains(r.stderr, "bucket fresh") ||
		!strings.Contains(r.stderr, "warmstart store init") {
		t.Errorf("list before the bucket exists: exit %d, stderr %q; want exit 1 saying to run warmstart store init", r.code, r.stderr)
	}
	if r := runCLI(t, "--config", cfg, "store", "init"); r.code != 0 || !strings.HasPrefix(r.stdout, "created bucket fresh") {
		t.Errorf("store init: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, "--config", cfg, "store", "init"); r.code != 0 || !strings.Contains(r.stdout, "exists") {
		t.Errorf("store init again: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, "--config", cfg, "snapshot", "list"); r.code != 0 {
		t.Errorf("list after store init: exit %d, stderr %q", r.code, r.stderr)
	}
}
