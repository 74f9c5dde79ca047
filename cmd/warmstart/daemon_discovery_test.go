package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/cli"
	"warmstart/internal/config"
)

// discoveryConfig writes a configuration that sets only the store, the
// runtime root and the replay VMM, so the daemon socket is the one
// derived from the runtime root, and returns its path and the parsed
// configuration.
func discoveryConfig(t *testing.T, dir string) (string, *config.Config) {
	t.Helper()
	trace := filepath.Join(dir, "trace")
	if err := os.WriteFile(trace, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf("[backend.posix_fs]\nsnapshot_store = %q\n[runtime]\ndir = %q\n[vmm]\ndriver = \"replay\"\n[replay]\ntrace = %q\n",
		filepath.Join(dir, "store"), filepath.Join(dir, "run"), trace)
	file := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	return file, cfg
}

// shortDir is a temporary directory short enough for Unix socket paths.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "wsd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// "restores list" finds a daemon without --daemon: by $WARMSTART_DAEMON,
// else on the configuration's [daemon] socket, which derives from
// [runtime] dir. Without a daemon it says how to start or name one.
func TestRestoresListFindsTheDaemon(t *testing.T) {
	t.Setenv(cli.DaemonEnv, "")
	dir := shortDir(t)
	file, cfg := discoveryConfig(t, dir)
	if want := filepath.Join(dir, "run", "warmstart.sock"); cfg.Daemon.Socket != want {
		t.Fatalf("[daemon] socket %q, want %q (under [runtime] dir)", cfg.Daemon.Socket, want)
	}
	if res := runCLI(t, "--config", file, "restores", "list"); res.code != 1 || !strings.Contains(res.stderr, "warmstart serve") || !strings.Contains(res.stderr, cli.DaemonEnv) {
		t.Errorf("no daemon: exit %d, stderr %q; want exit 1 saying how to start or name one", res.code, res.stderr)
	}
	serveDaemon(t, cfg, "")
	if res := runCLI(t, "--config", file, "restores", "list"); res.code != 0 || !strings.Contains(res.stdout, "SNAPSHOT") {
		t.Errorf("configured socket: exit %d, stdout %q, stderr %q", res.code, res.stdout, res.stderr)
	}
	// The variable names the daemon for a configuration whose socket is
	// elsewhere, in the unix:PATH form.
	other, _ := discoveryConfig(t, shortDir(t))
	t.Setenv(cli.DaemonEnv, "unix:"+cfg.Daemon.Socket)
	if res := runCLI(t, "--config", other, "restores", "list"); res.code != 0 {
		t.Errorf("%s=unix:%s: exit %d, stderr %q", cli.DaemonEnv, cfg.Daemon.Socket, res.code, res.stderr)
	}
}

// --daemon takes HOST:PORT as well as http://HOST:PORT.
func TestDaemonFlagHostPort(t *testing.T) {
	t.Setenv(cli.DaemonEnv, "")
	dir := shortDir(t)
	file, cfg := discoveryConfig(t, dir)
	d := serveDaemon(t, cfg, "127.0.0.1:0")
	token, err := api.ReadToken(cfg.DaemonTokenFile())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("WARMSTART_TOKEN", token)
	hostPort := strings.TrimPrefix(d.Endpoint(), "http://")
	for _, addr := range []string{hostPort, d.Endpoint()} {
		if res := runCLI(t, "--config", file, "--daemon", addr, "restores", "list"); res.code != 0 {
			t.Errorf("--daemon %s: exit %d, stderr %q", addr, res.code, res.stderr)
		}
	}
}
