package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"warmstart/internal/config"
	tracefile "warmstart/internal/trace"
)

// TestUnknownCommandsExit2 runs verbs and subcommands that do not exist: each
// is a usage error naming the unknown word (and what it may have meant), not
// a help page and success.
func TestUnknownCommandsExit2(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"frobnicate"}, []string{`unknown command "frobnicate" for "warmstart"`}},
		{[]string{"snapshot", "lst"}, []string{`unknown command "lst" for "warmstart snapshot"`, `did you mean "list"?`}},
		{[]string{"snapshot", "lst", "--store", "/nonexistent"}, []string{`unknown command "lst" for "warmstart snapshot"`}},
		{[]string{"restores", "stpo", "x"}, []string{`unknown command "stpo" for "warmstart restores"`, `"stop"`}},
		{[]string{"config", "chek"}, []string{`unknown command "chek" for "warmstart config"`, `did you mean "check"?`}},
		{[]string{"manifest", "dump"}, []string{`unknown command "dump" for "warmstart manifest"`}},
		{[]string{"restor", "web"}, []string{`unknown command "restor" for "warmstart"`, `"restore"`}},
		{[]string{"help", "frobnicate"}, []string{`unknown command "frobnicate" for "warmstart"`}},
		{[]string{"help", "snapshot", "lst"}, []string{`unknown command "lst" for "warmstart snapshot"`}},
		{[]string{"completion", "tcsh"}, []string{`unknown command "tcsh" for "warmstart completion"`}},
		{[]string{"synth", "extra"}, []string{`"extra"`}},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			r := runCLI(t, c.args...)
			if r.code != 2 {
				t.Errorf("exit %d, want 2; stderr %q", r.code, r.stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q lacks %q", r.stderr, w)
				}
			}
			if r.stdout != "" {
				t.Errorf("a usage error printed to stdout: %q", r.stdout)
			}
		})
	}
}

// TestGroupsWithoutSubcommandPrintHelp: a verb group, or no verb at all,
// still prints its help and succeeds.
func TestGroupsWithoutSubcommandPrintHelp(t *testing.T) {
	for _, args := range [][]string{nil, {"snapshot"}, {"help", "snapshot", "list"}} {
		r := runCLI(t, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage:") {
			t.Errorf("warmstart %q: exit %d, stdout %q, stderr %q; want its help and exit 0", args, r.code, r.stdout, r.stderr)
		}
	}
}

// TestRestoreRefusesBadFlagsUpFront gives restore flag values no restore can
// use: each exits 2 naming the flag, before the runtime directory, where the
// memory device would be mounted, is even created.
func TestRestoreRefusesBadFlagsUpFront(t *testing.T) {
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--device", "nvme"}, `--device "nvme": want file or uffd`},
		{[]string{"--io-engine", "7"}, "--io-engine 7: want 0 or 1 (buffered) or 2 (direct I/O)"},
		{[]string{"--io-engine", "-1"}, "--io-engine -1"},
		{[]string{"--io-engine", "fast"}, `"fast" is not one of "buffered", "buffered_async", "direct" (or 0, 1, 2)`},
		// A name is the same engine as its integer, under the same rules.
		{[]string{"--device", "uffd", "--io-engine", "direct"}, "--io-engine 2: the I/O engine is how the file device reads"},
		{[]string{"--prefetch", "maybe"}, `--prefetch "maybe": want auto, on or off`},
		{[]string{"--policy", "fastest"}, `--policy: unknown prefetch policy "fastest"`},
		{[]string{"--plot", "timeline.pdf"}, `--plot: "timeline.pdf": picture file must end in .svg or .png`},
		{[]string{"--device", ""}, `--device "": want file or uffd`},
		{[]string{"--pausable"}, "--pausable needs --daemon and --hold"},
		{[]string{"--pausable", "--hold"}, "--pausable needs --daemon and --hold"},
		{[]string{"--plot", "/nonexistent-dir/x.svg"}, `--plot: /nonexistent-dir/x.svg: directory /nonexistent-dir: `},
		{[]string{"--plot", "/dev/null/x.svg"}, `--plot: /dev/null/x.svg: directory /dev/null: not a directory`},
	} {
		t.Run(strings.Join(c.flags, " "), func(t *testing.T) {
			cfg, run, trace := restoreFixture(t)
			r := runCLI(t, append([]string{"--config", cfg, "restore", "web", "--trace", trace}, c.flags...)...)
			if r.code != 2 || !strings.Contains(r.stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", r.code, r.stderr, c.want)
			}
			if _, err := os.Stat(run); !os.IsNotExist(err) {
				t.Errorf("the runtime directory was created (stat: %v): the verb got as far as mounting", err)
			}
		})
	}
	cfg, run, trace := restoreFixture(t)
	if r := runCLI(t, "--config", cfg, "restore", "", "--trace", trace); r.code != 2 || !strings.Contains(r.stderr, "snapshot argument is empty") {
		t.Errorf("empty snapshot: exit %d, stderr %q; want exit 2 saying the snapshot argument is empty", r.code, r.stderr)
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Errorf("empty snapshot: the runtime directory was created (stat: %v)", err)
	}
	// The daemon would refuse it too, but only after a round trip.
	sock := filepath.Join(t.TempDir(), "none.sock")
	if r := runCLI(t, "--daemon", sock, "restore", "web", "--device", "nvme"); r.code != 2 || !strings.Contains(r.stderr, `--device "nvme"`) {
		t.Errorf("with --daemon: exit %d, stderr %q; want exit 2 naming --device", r.code, r.stderr)
	}
	if r := runCLI(t, "--daemon", sock, "restore", "web", "--pausable"); r.code != 2 || !strings.Contains(r.stderr, "--pausable needs --daemon and --hold") {
		t.Errorf("--pausable without --hold: exit %d, stderr %q; want exit 2 naming --pausable", r.code, r.stderr)
	}
	if r := runCLI(t, "--daemon", sock, "restore", "web", "--plot", "t.svg"); r.code != 2 || !strings.Contains(r.stderr, "--plot") {
		t.Errorf("--plot with --daemon: exit %d, stderr %q; want exit 2 naming --plot", r.code, r.stderr)
	}
}

// TestRestoreRefusesDeviceTheVMMCannotUse: in process, a restore on a
// device the configured VMM cannot restore with (QEMU has no Uffd backend)
// is a usage error naming --device, or [memory] device when the default
// names it, before the runtime directory exists (nothing mounted, no probe
// or VMM started), as the daemon refuses it with a 400 naming device.
func TestRestoreRefusesDeviceTheVMMCannotUse(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no QEMU here")
	}
	const want = `memory backend not supported by the QEMU driver: "Uffd" (only "File")`
	for _, c := range []struct {
		name, table string
		flags       []string
		named       string
	}{
		{"--device", "[vmm]\ndriver = \"qemu\"\n", []string{"--device", "uffd"}, `--device "uffd": `},
		{"--vmm", "", []string{"--vmm", "qemu", "--device", "uffd"}, `--device "uffd": `},
		{"configured", "[vmm]\ndriver = \"qemu\"\n[memory]\ndevice = \"uffd\"\n", nil, `[memory] device "uffd", used when --device is left out: `},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, run, _ := restoreFixture(t)
			appendFile(t, cfg, c.table+"[qemu]\naccel = \"tcg\"\n")
			r := runCLI(t, append([]string{"--config", cfg, "restore", "web"}, c.flags...)...)
			if r.code != 2 || !strings.Contains(r.stderr, c.named+want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", r.code, r.stderr, c.named+want)
			}
			if _, err := os.Stat(run); !os.IsNotExist(err) {
				t.Errorf("the runtime directory was created (stat: %v): the verb got as far as mounting", err)
			}
		})
	}
}

// appendFile appends text to the file at path.
func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// restoreFixture writes a configuration whose runtime directory and store
// lie in a fresh temporary directory, and an empty startup trace for the
// replay VMM. It returns the paths of the configuration, the runtime
// directory and the trace.
func restoreFixture(t *testing.T) (cfg, run, trace string) {
	t.Helper()
	dir := t.TempDir()
	run = filepath.Join(dir, "run")
	cfg = filepath.Join(dir, "warmstart.toml")
	text := "[runtime]\ndir = \"" + run + "\"\n[backend.posix_fs]\nsnapshot_store = \"" + filepath.Join(dir, "store") + "\"\n" + noRecording
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	trace = filepath.Join(dir, "startup.trace")
	if err := os.WriteFile(trace, []byte(tracefile.Header+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg, run, trace
}

// TestTraceRefusedBeforeMounting: a --trace that is a directory, absent, a
// FIFO (which would block open(2) for ever) or not a startup trace is a
// usage error naming the flag, before the runtime directory (where devices
// are mounted and VMM logs kept) exists.
func TestTraceRefusedBeforeMounting(t *testing.T) {
	cfg, run, _ := restoreFixture(t)
	notATrace := filepath.Join(filepath.Dir(cfg), "notes.txt")
	if err := os.WriteFile(notATrace, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(filepath.Dir(cfg), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ trace, want string }{
		{filepath.Dir(cfg), "is a directory"},
		{notATrace, "not a startup trace"},
		{fifo, "not a startup trace: open trace: open " + fifo + ": not a regular file"},
		{filepath.Join(filepath.Dir(cfg), "absent"), "not a startup trace"},
	} {
		for _, verb := range [][]string{{"restore", "web"}, {"snapshot", "record-manifest", "web"}} {
			r := runCLI(t, append(append([]string{"--config", cfg}, verb...), "--trace", c.trace)...)
			if r.code != 2 || !strings.Contains(r.stderr, "--trace "+c.trace+": "+c.want) {
				t.Errorf("%s --trace %s: exit %d, stderr %q; want exit 2 and %q", verb, c.trace, r.code, r.stderr, c.want)
			}
			if _, err := os.Stat(run); !os.IsNotExist(err) {
				t.Errorf("%s: the runtime directory was created (stat: %v)", verb, err)
			}
		}
	}
}

// TestBenchNamesOnlyTheBadBlockFlag: a bad --blocks, --reserve-blocks or
// --memory-size is a usage error naming that flag alone, before any work.
func TestBenchNamesOnlyTheBadBlockFlag(t *testing.T) {
	for _, c := range []struct {
		flags     []string
		want, not string
	}{
		{[]string{"--blocks", "-1"}, "--blocks -1: want 1 to 1000", "--reserve-blocks"},
		{[]string{"--reserve-blocks", "-1"}, "--reserve-blocks -1: want 0 to 1000", "--blocks "},
		// Orders for every block are drawn up front: a count this large
		// once filled the host's memory before the first trial.
		{[]string{"--blocks", "1000000000"}, "--blocks 1000000000: want 1 to 1000", "--reserve-blocks"},
		{[]string{"--memory-size", "1"}, "--memory-size 1: synthetic memory size 1", "--blocks"},
	} {
		r := runCLI(t, append([]string{"bench", "--memory-size", "8MiB", "--policies", "seed"}, c.flags...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || strings.Contains(r.stderr, c.not) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2, %q and no %q", c.flags, r.code, r.stderr, c.want, c.not)
		}
	}
}

// TestBenchRefusesBadIOEngineUpFront: bench refuses --io-engine 7 before it
// synthesizes a snapshot or starts a trial.
// A name is refused as restore refuses it (bench takes names too).
func TestBenchRefusesBadIOEngineUpFront(t *testing.T) {
	for engine, want := range map[string]string{"7": "--io-engine 7", "fast": `"fast" is not one of "buffered"`} {
		r := runCLI(t, "bench", "--io-engine", engine, "--blocks", "1", "--memory-size", "8MiB", "--policies", "seed")
		if r.code != 2 || !strings.Contains(r.stderr, want) || r.stdout != "" {
			t.Errorf("--io-engine %s: exit %d, stdout %q, stderr %q; want exit 2 naming %s", engine, r.code, r.stdout, r.stderr, want)
		}
	}
}

// bench refuses a picture it cannot draw, or a --json it could not
// write, before any trial runs.
func TestBenchRefusesBadPlotUpFront(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--plot", "bench.pdf"}, "must end in .svg or .png"},
		{[]string{"--plot", "/nonexistent-dir/b.svg", "--repository", "s3"}, "--plot"},
		{[]string{"--json-file", "/nonexistent-dir/x.json"}, "--json-file: /nonexistent-dir/x.json: directory /nonexistent-dir"},
		{[]string{"--json-file", dir}, "is a directory"},
		{[]string{"--json-file", "/nonexistent-dir/x.json", "--repository", "s3"}, "--json-file"},
	} {
		r := runCLI(t, append([]string{"bench", "--blocks", "1", "--memory-size", "8MiB", "--policies", "seed"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || r.stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, r.code, r.stdout, r.stderr, c.want)
		}
	}
}

// Read-only verbs never create a store: a mistyped --store is an error
// naming the path, and leaves no directory behind.
func TestReadOnlyVerbsDoNotCreateAStore(t *testing.T) {
	typo := filepath.Join(t.TempDir(), "typo")
	for _, args := range [][]string{
		{"snapshot", "list", "--store", typo},
		{"snapshot", "show", "--store", typo, "web"},
		{"snapshot", "verify", "--store", typo, "--all"},
	} {
		res := runCLI(t, args...)
		if res.code != 1 || !strings.Contains(res.stderr, typo) {
			t.Errorf("%q: exit %d, stderr %q; want exit 1 naming %s", args, res.code, res.stderr, typo)
		}
		if _, err := os.Lstat(typo); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%q created %s: %v", args, typo, err)
		}
	}
}

// TestDaemonFlagOnlyWhereUsed: --daemon exists only on the verbs that can
// run on a daemon. Elsewhere (before or after the verb) it is an unknown
// flag and a usage error, where it used to be silently ignored (capture
// --daemon X booted locally); the verbs that have it try the daemon.
func TestDaemonFlagOnlyWhereUsed(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "no-daemon.sock")
	for _, args := range [][]string{
		{"synth", "--daemon", sock},
		{"config", "defaults", "--daemon", sock},
		{"bench", "--daemon", sock},
		{"demo", "--daemon", sock},
		{"manifest", "inspect", "--daemon", sock, "x"},
		{"capture", "--daemon", sock},
		{"--daemon", sock, "capture"},
		{"--daemon", sock, "serve"},
		{"version", "--daemon", sock},
	} {
		if r := runCLI(t, args...); r.code != 2 || !strings.Contains(r.stderr, "unknown flag: --daemon") {
			t.Errorf("warmstart %q: exit %d, %q; want 2 and the unknown flag named", args, r.code, r.stderr)
		}
	}
	for _, args := range [][]string{
		{"snapshot", "list", "--daemon", sock},
		{"--daemon", sock, "snapshot", "show", "web"},
		{"restore", "web", "--daemon", sock},
		{"restores", "list", "--daemon", sock},
	} {
		if r := runCLI(t, args...); r.code != 1 || !strings.Contains(r.stderr, sock) {
			t.Errorf("warmstart %q: exit %d, %q; want 1 and the unreachable daemon named", args, r.code, r.stderr)
		}
	}
}

// TestConfigFileResolution: without --config the CLI reads
// $WARMSTART_CONFIG, else the system file when present; --config wins.
func TestConfigFileResolution(t *testing.T) {
	dir := t.TempDir()
	old := config.SystemFile
	config.SystemFile = filepath.Join(dir, "system.toml")
	t.Cleanup(func() { config.SystemFile = old })
	bad := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("[memory]\nio_engine = 7\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv(config.EnvFile, "")
	if out, _, err := runVerb(t, "config", "check"); err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("no file anywhere: %q, %v; want the defaults", out, err)
	}
	system := bad("system.toml")
	if _, _, err := runVerb(t, "config", "check"); err == nil || !strings.Contains(err.Error(), system) {
		t.Errorf("system file present: %v, want its error", err)
	}
	env := bad("env.toml")
	t.Setenv(config.EnvFile, env)
	if _, _, err := runVerb(t, "config", "check"); err == nil || !strings.Contains(err.Error(), env) {
		t.Errorf("%s set: %v, want that file's error", config.EnvFile, err)
	}
	good := filepath.Join(dir, "good.toml")
	if err := os.WriteFile(good, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, err := runVerb(t, "--config", good, "config", "check"); err != nil || strings.TrimSpace(out) != "ok" {
		t.Errorf("--config given: %q, %v; want it to win", out, err)
	}
}

// TestOutputFilesRefusedUpFront: a --json or --plot file that could not be
// written (its directory missing, or the path a directory) is a usage error
// naming the flag, before any benchmark trial or manifest lookup, not a
// late exit 1 after the work.
func TestOutputFilesRefusedUpFront(t *testing.T) {
	dir := t.TempDir()
	dirSVG := filepath.Join(dir, "taken.svg")
	if err := os.Mkdir(dirSVG, 0o700); err != nil {
		t.Fatal(err)
	}
	absent := filepath.Join(dir, "absent", "x.json")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--json-file", absent, "--blocks", "1", "--memory-size", "8MiB", "--policies", "seed"}, "--json-file: " + absent},
		{[]string{"bench", "--json-file", dir, "--blocks", "1", "--memory-size", "8MiB", "--policies", "seed"}, "--json-file: " + dir + ": is a directory"},
		{[]string{"manifest", "inspect", filepath.Join(dir, "no.manifest"), "--plot", dirSVG}, "--plot"},
	} {
		r := runCLI(t, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || r.stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 naming %q", c.args, r.code, r.stdout, r.stderr, c.want)
		}
	}
}

// TestDemoRefusesBadBlocksUpFront: demo refuses a block count bench would
// refuse before it synthesizes or publishes anything.
func TestDemoRefusesBadBlocksUpFront(t *testing.T) {
	for _, n := range []string{"0", "5000"} {
		r := runCLI(t, "demo", "--blocks", n)
		if r.code != 2 || !strings.Contains(r.stderr, "--blocks "+n+": want 1 to 1000") || r.stdout != "" {
			t.Errorf("demo --blocks %s: exit %d, stdout %q, stderr %q; want exit 2 and nothing done", n, r.code, r.stdout, r.stderr)
		}
	}
}

// A verb called with the wrong arguments says so once, under the
// program's name, and shows what it takes.
func TestWrongArgumentsNameWhatTheVerbTakes(t *testing.T) {
	r := runCLI(t, "restore")
	want := "warmstart: restore: accepts 1 arg(s), received 0; usage: warmstart restore ID|ALIAS\n"
	if r.code != 2 || r.stderr != want {
		t.Errorf("restore without an argument: exit %d, stderr %q; want exit 2, %q", r.code, r.stderr, want)
	}
}

// Shell completion offers the snapshots a verb can name (aliases, with
// their ids) and the values of enumerated flags.
func TestCompletionOffersSnapshotsAndValues(t *testing.T) {
	root := importedCLIRoot(t, "wscomp-", 13, "web")
	r := runCLI(t, "--config", root.cfg, "__complete", "restore", "")
	if r.code != 0 || !strings.Contains(r.stdout, "web\t") {
		t.Errorf("restore's argument: exit %d, %q; want the alias web offered", r.code, r.stdout)
	}
	r = runCLI(t, "--config", root.cfg, "__complete", "snapshot", "show", "w")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "web\t") {
		t.Errorf("snapshot show w: exit %d, %q; want web", r.code, r.stdout)
	}
	for flag, want := range map[string]string{"--prefetch": "auto\non\noff\n", "--vmm": "auto\nreplay\nfirecracker\nqemu\n"} {
		r = runCLI(t, "__complete", "restore", flag, "")
		if r.code != 0 || !strings.HasPrefix(r.stdout, want) {
			t.Errorf("restore %s: exit %d, %q; want %q", flag, r.code, r.stdout, want)
		}
	}
}
