package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/lab/miniotest"
	"warmstart/internal/repository/posixfs"
)

// The mistakes a new operator makes first each end in an error that says
// what to do next, on stderr and in the --json failure document alike.

// A snapshot name no snapshot has: every verb that takes one points at
// the verb that lists the snapshots there are.
func TestSnapshotNotFoundSaysHowToListThem(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	if _, err := posixfs.Open(store, posixfs.Options{}); err != nil {
		t.Fatal(err)
	}
	cfg := noRecordingConfig(t)
	for _, verb := range [][]string{
		{"restore", "nope"},
		{"snapshot", "show", "nope"},
		{"snapshot", "verify", "nope"},
		{"snapshot", "record-manifest", "nope"},
		{"manifest", "inspect", "nope"},
	} {
		args := append([]string{"--config", cfg}, verb...)
		r := runCLI(t, append(args, "--store", store)...)
		name := strings.Join(verb, " ")
		if r.code != 1 || !strings.Contains(r.stderr, "warmstart snapshot list") {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 naming `warmstart snapshot list`", name, r.code, r.stderr)
		}
	}
	r := runCLI(t, "--config", cfg, "restore", "nope", "--json", "--store", store)
	var doc struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || !strings.Contains(doc.Error, "warmstart snapshot list") {
		t.Errorf("restore --json: %v; document %q lacks the hint", err, r.stdout)
	}
}

// A configuration (or none: the built-in defaults) naming a POSIX store
// that does not exist: the error names the key that named it and how to
// create one.
func TestMissingStoreSaysHowToMakeOne(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	text := fmt.Sprintf("[backend.posix_fs]\nsnapshot_store = %q\n[runtime]\ndir = %q\n",
		filepath.Join(dir, "absent"), filepath.Join(dir, "run"))
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, verb := range [][]string{{"snapshot", "list"}, {"snapshot", "show", "ref"}, {"restore", "ref"}} {
		r := runCLI(t, append([]string{"--config", cfg}, verb...)...)
		for _, want := range []string{filepath.Join(dir, "absent"), "snapshot_store", "warmstart store init"} {
			if r.code != 1 || !strings.Contains(r.stderr, want) {
				t.Errorf("%s: exit %d, stderr %q; want exit 1 naming %q", strings.Join(verb, " "), r.code, r.stderr, want)
			}
		}
	}
	// --store names the directory itself: the error says to check it.
	r := runCLI(t, "--config", cfg, "snapshot", "list", "--store", filepath.Join(dir, "typo"))
	if r.code != 1 || !strings.Contains(r.stderr, "--store") {
		t.Errorf("snapshot list --store typo: exit %d, stderr %q; want exit 1 naming --store", r.code, r.stderr)
	}
}

// A daemon named with --daemon that does not answer: the error says to
// start one, whatever form the address took.
func TestDaemonNotRunningSaysHowToStartOne(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sock := filepath.Join(dir, "no.sock")
	cfg := noRecordingConfig(t)
	for _, args := range [][]string{
		{"restores", "list", "--daemon", sock},
		{"snapshot", "list", "--daemon", "unix:" + sock},
		{"restore", "ref", "--daemon", sock, "--json"},
	} {
		r := runCLI(t, append([]string{"--config", cfg}, args...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "warmstart serve") || !strings.Contains(r.stderr, sock) {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 naming %s and `warmstart serve`", strings.Join(args, " "), r.code, r.stderr, sock)
		}
	}
	// Over TCP the token is looked for first: without one (no daemon ever
	// served there to create it) the error still says how to start one.
	runtime := filepath.Join(dir, "tcp.toml")
	if err := os.WriteFile(runtime, []byte(fmt.Sprintf("[runtime]\ndir = %q\n", filepath.Join(dir, "run"))), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLIEnv(t, []string{"WARMSTART_TOKEN="}, "--config", runtime, "restores", "list", "--daemon", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	if r.code != 1 || !strings.Contains(r.stderr, "warmstart serve --listen") {
		t.Errorf("TCP daemon without a token: exit %d, stderr %q; want exit 1 naming `warmstart serve --listen`", r.code, r.stderr)
	}
}

// S3 credentials the store refuses, or none at all: the error names the
// keys that hold them.
func TestS3CredentialsRefusedNameTheKeys(t *testing.T) {
	t.Parallel()
	srv := miniotest.Start(t)
	if err := srv.MakeBucket(context.Background(), "warmstart"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, creds := range map[string]string{
		"wrong secret": fmt.Sprintf("access_key_id = %q\nsecret_access_key = \"wrong-secret\"\n", miniotest.AccessKey),
		"no keys":      "",
	} {
		cfg := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".toml")
		text := fmt.Sprintf("[snapshot]\nrepository_backend = \"s3\"\n[backend.s3]\nendpoint = \"http://%s\"\n"+
			"bucket = \"warmstart\"\ncache_dir = %q\n%s[runtime]\ndir = %q\n",
			srv.Endpoint, filepath.Join(dir, "cache"), creds, filepath.Join(dir, "run"))
		if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, verb := range [][]string{{"snapshot", "list"}, {"store", "init"}} {
			r := runCLIEnv(t, []string{"AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", "AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(dir, "none")},
				append([]string{"--config", cfg}, verb...)...)
			if r.code != 1 || !strings.Contains(r.stderr, "access_key_id") || !strings.Contains(r.stderr, "secret_access_key") {
				t.Errorf("%s, %s: exit %d, stderr %q; want exit 1 naming [backend.s3] access_key_id and secret_access_key",
					name, strings.Join(verb, " "), r.code, r.stderr)
			}
		}
	}
}

// An object store that does not answer at the configured endpoint (not
// started, or the wrong port): the error names the key and the endpoint.
func TestS3StoreNotRunningNamesTheEndpoint(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	cfg := filepath.Join(dir, "s3.toml")
	text := fmt.Sprintf("[snapshot]\nrepository_backend = \"s3\"\n[backend.s3]\nendpoint = %q\nbucket = \"warmstart\"\n"+
		"access_key_id = \"k\"\nsecret_access_key = \"s\"\ncache_dir = %q\n[runtime]\ndir = %q\n",
		endpoint, filepath.Join(dir, "cache"), filepath.Join(dir, "run"))
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, verb := range [][]string{{"snapshot", "list"}, {"store", "init"}} {
		r := runCLI(t, append([]string{"--config", cfg}, verb...)...)
		// Exit 6: a store that does not answer (docs/commands.md).
		if r.code != 6 || !strings.Contains(r.stderr, "[backend.s3] endpoint") || !strings.Contains(r.stderr, endpoint) {
			t.Errorf("%s: exit %d, stderr %q; want exit 6 naming [backend.s3] endpoint %s", strings.Join(verb, " "), r.code, r.stderr, endpoint)
		}
	}
}

// A restore id the daemon does not hold (a typo, or one already stopped):
// the error points at the verb that lists the ones it holds.
func TestUnknownRestoreSaysHowToListThem(t *testing.T) {
	t.Parallel()
	file, cfg := discoveryConfig(t, shortDir(t))
	serveDaemon(t, cfg, "")
	for _, verb := range [][]string{{"restores", "stop", "nope"}, {"restores", "snapshot", "nope"}} {
		r := runCLI(t, append([]string{"--config", file, "--daemon", cfg.Daemon.Socket}, verb...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "warmstart restores list") {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 naming `warmstart restores list`", strings.Join(verb, " "), r.code, r.stderr)
		}
	}
}
