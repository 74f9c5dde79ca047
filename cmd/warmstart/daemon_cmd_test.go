package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"warmstart/internal/api"
	"warmstart/internal/config"
	"warmstart/internal/daemon"
	"warmstart/internal/lab/synth"
	"warmstart/internal/node"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/trace"
)

// resetFlags sets every flag of the verb tree back to its default; flag
// values live in package variables and closures that outlive a run.
func resetFlags(c *cobra.Command) {
	for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
		fs.VisitAll(func(f *pflag.Flag) {
			if r, ok := f.Value.(interface{ Reset() }); ok {
				r.Reset() // a flag that refuses its own empty default
			} else {
				_ = f.Value.Set(f.DefValue)
			}
			f.Changed = false
		})
	}
	for _, sub := range c.Commands() {
		resetFlags(sub)
	}
}

// runVerb runs "warmstart ARGS..." in this process.
func runVerb(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	resetFlags(rootCmd)
	var out, errOut bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetErr(&errOut)
	rootCmd.SetArgs(args)
	t.Cleanup(func() {
		resetFlags(rootCmd)
		rootCmd.SetOut(nil)
		rootCmd.SetErr(nil)
		rootCmd.SetArgs(nil)
	})
	err = rootCmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// listTable is "restores list" as a table.
func listTable(t *testing.T, sock string) string {
	t.Helper()
	out, _, err := runVerb(t, "--daemon", sock, "restores", "list")
	if err != nil {
		t.Fatalf("restores list: %v", err)
	}
	return out
}

// The snapshot and restore verbs run against a daemon with --daemon.
func TestVerbsAgainstDaemon(t *testing.T) {
	dir, ref, sock := startVerbDaemon(t)
	id := importListRecord(t, sock, ref)
	verifyOverDaemon(t, sock, id)

	// Without --hold the verb stops the restore after printing it.
	out, _, err := runVerb(t, "--daemon", sock, "restore", "web", "--prefetch", "on", "--json")
	var in api.RestoreInfo
	if err != nil || json.Unmarshal([]byte(out), &in) != nil || in.Snapshot != id || in.Prefetch.State == "skipped" {
		t.Fatalf("restore --json = %q, %v", out, err)
	}
	if out, _, err = runVerb(t, "--daemon", sock, "restores", "list", "--json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Fatalf("restores after a restore without --hold = %q, %v", out, err)
	}
	held := restoreHeld(t, sock)
	killHeldAndStop(t, sock, held)
	checkVerbErrors(t, sock, ref, dir)

	if out, _, err = runVerb(t, "--daemon", sock, "snapshot", "delete", "web"); err != nil || !strings.Contains(out, "deleted snapshot "+id+" (alias web)") {
		t.Fatalf("delete = %q, %v", out, err)
	}
	if out, _, err = runVerb(t, "--daemon", sock, "snapshot", "delete", "web"); err != nil || !strings.Contains(out, "nothing to delete") {
		t.Fatalf("second delete = %q, %v", out, err)
	}
}

// startVerbDaemon generates a small reference in a short temporary
// directory and serves a replay daemon that may import from it; it returns
// the directory, the reference and the daemon's socket.
func startVerbDaemon(t *testing.T) (string, synth.Paths, string) {
	t.Helper()
	// Unix socket paths are short; t.TempDir's are not.
	dir, err := os.MkdirTemp("", "wsc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ref, err := synth.Generate(context.Background(), synth.Options{MemoryBytes: 16 << 20, Seed: 3, Dir: filepath.Join(dir, "ref")})
	if err != nil {
		t.Fatal(err)
	}
	cfg := replayDaemonConfig(dir, ref.Trace)
	cfg.Prefetch.OnRestore = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	serveDaemon(t, cfg, "")
	return dir, ref, cfg.Daemon.Socket
}

// importListRecord imports ref as web, checks list and show, records its
// manifest and returns its id.
func importListRecord(t *testing.T, sock string, ref synth.Paths) string {
	t.Helper()
	spec, err := os.ReadFile(ref.Layout)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runVerb(t, "--daemon", sock, "snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory,
		"--alias", "web", "--layout", strings.TrimSpace(string(spec)))
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	id := strings.TrimSpace(out)
	if err := repository.ValidateID(id); err != nil {
		t.Fatalf("import printed %q: %v", out, err)
	}
	out, _, err = runVerb(t, "--daemon", sock, "snapshot", "list", "--json")
	var recs []repository.Record
	if err != nil || json.Unmarshal([]byte(out), &recs) != nil || len(recs) != 1 || recs[0].ID != id {
		t.Fatalf("list = %q, %v", out, err)
	}
	if out, _, err = runVerb(t, "--daemon", sock, "snapshot", "show", "web"); err != nil || !strings.Contains(out, id) || !regexp.MustCompile(`manifest:\s+none`).MatchString(out) {
		t.Fatalf("show before record = %q, %v", out, err)
	}
	if out, _, err = runVerb(t, "--daemon", sock, "snapshot", "record-manifest", "web"); err != nil || !strings.Contains(out, "attached startup manifest to "+id) {
		t.Fatalf("record-manifest = %q, %v", out, err)
	}
	return id
}

// verifyOverDaemon: "snapshot verify" of web and of --all report it ok.
func verifyOverDaemon(t *testing.T, sock, id string) {
	t.Helper()
	out, _, err := runVerb(t, "--daemon", sock, "snapshot", "verify", "web", "--json")
	var rep struct {
		ID string `json:"id"`
		OK bool   `json:"ok"`
	}
	if err != nil || json.Unmarshal([]byte(out), &rep) != nil || rep.ID != id || !rep.OK {
		t.Fatalf("verify --json = %q, %v", out, err)
	}
	if out, _, err = runVerb(t, "--daemon", sock, "snapshot", "verify", "--all"); err != nil || !strings.Contains(out, "snapshot "+id+" (alias web): ok") {
		t.Fatalf("verify --all = %q, %v", out, err)
	}
}

// restoreHeld restores web with --hold: the daemon keeps it until
// "restores stop", and lists it running. It returns the held restore.
func restoreHeld(t *testing.T, sock string) api.RestoreInfo {
	t.Helper()
	out, stderr, err := runVerb(t, "--daemon", sock, "restore", "web", "--hold")
	if err != nil || !strings.Contains(out, "ready") || !strings.Contains(stderr, "restores stop") {
		t.Fatalf("restore --hold = %q %q, %v", out, stderr, err)
	}
	out, _, err = runVerb(t, "--daemon", sock, "restores", "list", "--json")
	var held []api.RestoreInfo
	if err != nil || json.Unmarshal([]byte(out), &held) != nil || len(held) != 1 {
		t.Fatalf("restores list = %q, %v", out, err)
	}
	if held[0].State != "running" || !strings.Contains(listTable(t, sock), "running") {
		t.Fatalf("held restore listed as %q, want running", held[0].State)
	}
	return held[0]
}

// killHeldAndStop: its VM killed, the list says it exited and how; the
// stop releases it and tells.
func killHeldAndStop(t *testing.T, sock string, held api.RestoreInfo) {
	t.Helper()
	vmPID := held.Ready.PID
	if vmPID <= 0 {
		t.Fatalf("ready detail %v has no VMM pid", held.Ready)
	}
	if err := syscall.Kill(vmPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	const killed = "exited: killed by signal 9 (killed)"
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(listTable(t, sock), killed) {
		if time.Now().After(deadline) {
			t.Fatalf("restores list does not say %q after the VM was killed:\n%s", killed, listTable(t, sock))
		}
		time.Sleep(10 * time.Millisecond) // the daemon learns of the exit asynchronously
	}
	if out, _, err := runVerb(t, "--daemon", sock, "restores", "stop", held.ID); err != nil || !strings.Contains(out, "stopped") ||
		!strings.Contains(out, "the VM had exited after ready: killed by signal 9 (killed)") {
		t.Fatalf("restores stop = %q, %v", out, err)
	}
}

// checkVerbErrors: unknown names fail with ErrNotFound, bad arguments
// and combinations with usage errors.
func checkVerbErrors(t *testing.T, sock string, ref synth.Paths, dir string) {
	t.Helper()
	var ue usageError
	// No daemon answers on this configuration's socket: restores list,
	// which needs one, fails naming it (not a usage error: the command
	// line is right, the daemon is missing).
	noDaemon := filepath.Join(dir, "nodaemon.toml")
	if err := os.WriteFile(noDaemon, []byte(fmt.Sprintf("[runtime]\ndir = %q\n", filepath.Join(dir, "nodaemon"))), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args  []string
		usage bool
		want  error
	}{
		{[]string{"--daemon", sock, "restore", "nobody"}, false, repository.ErrNotFound},
		{[]string{"--daemon", sock, "restore", "web", "--device", "nbd"}, true, nil},
		{[]string{"--daemon", sock, "restore", "web", "--trace", ref.Trace}, true, nil},
		{[]string{"--daemon", sock, "snapshot", "show", "bad/alias"}, true, nil},
		{[]string{"--daemon", sock, "snapshot", "verify", "nobody"}, false, repository.ErrNotFound},
		{[]string{"--daemon", sock, "snapshot", "verify", "bad/alias"}, true, nil},
		{[]string{"--daemon", sock, "snapshot", "verify", "web", "--store", dir}, true, nil},
		{[]string{"--config", noDaemon, "restores", "list"}, false, nil},
		{[]string{"--daemon", sock, "serve"}, true, nil},
	} {
		_, _, err := runVerb(t, tc.args...)
		if err == nil || errors.As(err, &ue) != tc.usage || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("warmstart %s: %v (usage error: %t), want usage error %t matching %v", strings.Join(tc.args, " "), err, errors.As(err, &ue), tc.usage, tc.want)
		}
	}
}

// A verb against a daemon serving TCP sends its bearer token, from
// WARMSTART_TOKEN or the configuration's token file; without one the
// daemon refuses it.
func TestDaemonOverTCPNeedsTheToken(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Backend.PosixFS.SnapshotStore = filepath.Join(dir, "store")
	cfg.Memory.FUSEMount = filepath.Join(dir, "mnt")
	cfg.Runtime.Dir = filepath.Join(dir, "run")
	cfg.VMM.Driver, cfg.Replay.Trace = config.DriverReplay, filepath.Join(dir, "trace")
	if err := os.WriteFile(cfg.Replay.Trace, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d := serveDaemon(t, cfg, "127.0.0.1:0")
	token, err := api.ReadToken(cfg.DaemonTokenFile())
	if err != nil {
		t.Fatal(err)
	}
	clientConfig := func(tokenFile string) string {
		p := filepath.Join(t.TempDir(), "client.toml")
		if err := os.WriteFile(p, []byte(fmt.Sprintf("[daemon]\ntoken_file = %q\n", tokenFile)), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	list := func(configFile string) cliRun {
		return runCLI(t, "--config", configFile, "--daemon", d.Endpoint(), "snapshot", "list")
	}
	t.Setenv("WARMSTART_TOKEN", "")
	if res := list(clientConfig(filepath.Join(dir, "absent.token"))); res.code == 0 || !strings.Contains(res.stderr, "token") {
		t.Errorf("without a token: exit %d, stderr %q; want a failure naming the token", res.code, res.stderr)
	}
	if res := list(clientConfig(cfg.DaemonTokenFile())); res.code != 0 {
		t.Errorf("with the configured token file: exit %d, stderr %q", res.code, res.stderr)
	}
	t.Setenv("WARMSTART_TOKEN", "wrong")
	if res := list(clientConfig(cfg.DaemonTokenFile())); res.code == 0 || !strings.Contains(res.stderr, "401") {
		t.Errorf("with a wrong WARMSTART_TOKEN: exit %d, stderr %q; want the daemon's 401", res.code, res.stderr)
	}
	t.Setenv("WARMSTART_TOKEN", token)
	if res := list(clientConfig(filepath.Join(dir, "absent.token"))); res.code != 0 {
		t.Errorf("with WARMSTART_TOKEN: exit %d, stderr %q", res.code, res.stderr)
	}
}

// serveDaemon runs a daemon of cfg in this process, on listen or, when it
// is empty, cfg's socket, until the test ends.
func serveDaemon(t *testing.T, cfg *config.Config, listen string) *daemon.Daemon {
	t.Helper()
	repo, err := posixfs.Open(cfg.Backend.PosixFS.SnapshotStore, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return serveDaemonOf(t, cfg, listen, repo)
}

// serveDaemonOf is serveDaemon with the repository repo.
func serveDaemonOf(t *testing.T, cfg *config.Config, listen string, repo repository.Repository) *daemon.Daemon {
	t.Helper()
	vm, err := node.NewVMM(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Options{Config: cfg, Repository: repo, VMM: vm, Listen: listen})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- d.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	return d
}

// replayDaemonConfig is the configuration of a replay daemon whose store,
// mount, runtime directory and socket all lie in dir and which may import
// from dir.
func replayDaemonConfig(dir, trace string) *config.Config {
	cfg := config.Default()
	cfg.Backend.PosixFS.SnapshotStore = filepath.Join(dir, "store")
	cfg.Memory.FUSEMount = filepath.Join(dir, "mnt")
	cfg.Runtime.Dir = filepath.Join(dir, "run")
	cfg.Daemon.Socket = filepath.Join(dir, "d.sock")
	cfg.Daemon.ImportDirs = []string{dir}
	cfg.VMM.Driver, cfg.Replay.Trace = config.DriverReplay, trace
	return cfg
}

// "snapshot verify --all --daemon" reports a damaged catalog entry as a
// problem, as the in-process verb does, not only the listed snapshots.
func TestVerifyAllOverDaemonReportsDamage(t *testing.T) {
	dir, _, sock := startVerbDaemon(t)
	broken := filepath.Join(dir, "store", "catalog", "aliases", "broken")
	if err := os.WriteFile(broken, []byte("not an id\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runVerb(t, "--daemon", sock, "snapshot", "verify", "--all")
	if err == nil || !strings.Contains(out, "corrupt alias broken") {
		t.Fatalf("verify --all over the daemon with a damaged alias = %q, %v; want the damage reported and a failure", out, err)
	}
}

// "restore --daemon" without --hold stops what it restored even when it is
// interrupted: a signal while the daemon restores cancels the request
// (the daemon stops a restore whose client left) and the verb exits
// 128+signal, leaving the daemon holding nothing.
func TestDaemonRestoreInterrupted(t *testing.T) {
	dir, ref, sock := startVerbDaemon(t)
	cfg := replayDaemonConfig(dir, ref.Trace)
	importListRecord(t, sock, ref)
	entries, err := trace.ReadFile(ref.Trace)
	if err != nil {
		t.Fatal(err)
	}
	entries[0].Compute += time.Minute // not ready within the test
	if err := trace.WriteFile(ref.Trace, entries); err != nil {
		t.Fatal(err)
	}
	cli := startCLI(t, false, "--daemon", sock, "restore", "web", "--prefetch", "off")
	if !waitForRunFile(t, filepath.Join(cfg.Runtime.Dir, "daemon", "restores", "*", "replay-vmm.log"), cli.exited) {
		t.Fatalf("the restore ended before its VMM was seen:\n%s", cli.outputText())
	}
	cli.signal(syscall.SIGINT)
	cli.wantExit(128+int(syscall.SIGINT), syscall.SIGINT)
	c := api.NewClient(sock)
	defer c.Close()
	if held, err := c.Restores(context.Background()); err != nil || len(held) != 0 {
		t.Fatalf("after the interrupted restore the daemon holds %v (%v), want nothing", held, err)
	}
}

// waitForRunFile polls until pattern matches a file, reporting false if
// done is closed first; it fails the test if neither happens within
// reachTimeout.
func waitForRunFile(t *testing.T, pattern string, done <-chan struct{}) bool {
	t.Helper()
	deadline := time.After(reachTimeout)
	for {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return true
		}
		select {
		case <-done:
			return false
		case <-deadline:
			t.Fatalf("no file matched %s within %v", pattern, reachTimeout)
		case <-time.After(time.Millisecond):
		}
	}
}

// A second signal to a daemon that is shutting down (here held up by a
// VMM that ignores its stop until its stop timeout kills it) says the
// shutdown goes on and ends by itself, and the daemon then ends with
// nothing mounted: it was silently swallowed before.
func TestServeSecondSignalSaysItIsStillShuttingDown(t *testing.T) {
	root := importedCLIRoot(t, "wsss-", 12, "held")
	cfg := filepath.Join(root.dir, "serve.toml")
	sock := filepath.Join(root.dir, "d.sock")
	text := fmt.Sprintf("[backend.posix_fs]\nsnapshot_store = %q\n[runtime]\ndir = %q\n[memory]\nfuse_mount = %q\n[daemon]\nsocket = %q\n[vmm]\ndriver = \"replay\"\n[replay]\ntrace = %q\n",
		filepath.Join(root.dir, "store"), root.run, filepath.Join(root.dir, "mnt"), sock, root.ref.Trace)
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	serve := startCLI(t, true, "--config", cfg, "serve")
	serve.waitOutput("daemon ready")
	c := api.NewClient(sock)
	defer c.Close()
	held, err := c.Restore(context.Background(), api.RestoreRequest{Snapshot: "held"})
	if err != nil {
		t.Fatal(err)
	}
	vmm := held.Ready.PID
	if vmm <= 0 {
		t.Fatalf("restore's ready detail %v has no VMM pid", held.Ready)
	}
	if err := syscall.Kill(vmm, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(vmm, syscall.SIGKILL) })
	serve.signal(syscall.SIGTERM)
	serve.waitOutput("shutdown begun")
	serve.signal(syscall.SIGTERM)
	serve.waitOutput("still shutting down")
	select {
	case <-serve.exited:
	case <-time.After(stopTimeout):
		t.Fatalf("serve still running %v after the signals", stopTimeout)
	}
	if ms := mountPointsBelow(t, root.dir); len(ms) > 0 {
		t.Errorf("mounts left: %v", ms)
	}
}
