package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/trust"
)

// Bounds on a CLI child: past them it is killed, so that a CLI that blocks
// or reads without bound fails its test without hurting the host.
const (
	cliGuard       = 10 * time.Second
	cliMaxRSSBytes = 512 << 20
)

// cliResult is how a CLI child ended.
type cliResult struct {
	exitCode int
	stderr   string
	// killed says why the test killed the child; empty if it exited alone.
	killed string
}

// runCLIChild runs "warmstart args..." in a child process, watching its
// resident memory until it exits.
func runCLIChild(t *testing.T, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = cliEnv("GORACE=atexit_sleep_ms=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	var res cliResult
	deadline := time.After(cliGuard)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for res.killed == "" {
		select {
		case <-exited:
			res.exitCode, res.stderr = cmd.ProcessState.ExitCode(), stderr.String()
			return res
		case <-deadline:
			res.killed = "still running after " + cliGuard.String()
		case <-tick.C:
			if rss := residentBytes(cmd.Process.Pid); rss > cliMaxRSSBytes {
				res.killed = "resident memory " + strconv.FormatInt(rss, 10) + " bytes"
			}
		}
	}
	cmd.Process.Kill()
	<-exited
	res.exitCode, res.stderr = cmd.ProcessState.ExitCode(), stderr.String()
	return res
}

// residentBytes is the resident set of process pid, 0 once it is gone.
func residentBytes(pid int) int64 {
	statm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(statm))
	if len(fields) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(fields[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// TestConfigThatIsNotARegularFile: --config naming a device that never
// ends (/dev/zero) or a FIFO nobody writes to fails at once with exit
// status 1 and an error naming the file, without reading or blocking.
func TestConfigThatIsNotARegularFile(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "warmstart.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/dev/zero", fifo} {
		res := runCLIChild(t, "config", "check", "--config", path)
		if res.killed != "" {
			t.Errorf("warmstart config check --config %s killed: %s", path, res.killed)
			continue
		}
		want := "warmstart: config " + path + ": "
		if res.exitCode != 1 || !strings.HasPrefix(res.stderr, want) || !strings.Contains(res.stderr, "not a regular file") {
			t.Errorf("warmstart config check --config %s: exit %d, stderr %q; want exit 1 and %q... not a regular file",
				path, res.exitCode, res.stderr, want)
		}
	}
}

// TestConfigCheckReadsReplayTrace: config check reports a [replay] trace
// that is a FIFO (which would block a restore's open for ever), absent or
// no startup trace, naming the key and the path, and exits 1; a FIFO is
// refused at once rather than blocking the check.
func TestConfigCheckReadsReplayTrace(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	notATrace := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(notATrace, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ trace, want string }{
		{fifo, "not a regular file"},
		{filepath.Join(dir, "absent"), "no such file"},
		{notATrace, "malformed"},
	} {
		cfg := filepath.Join(dir, "warmstart.toml")
		if err := os.WriteFile(cfg, []byte("[replay]\ntrace = \""+c.trace+"\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		res := runCLIChild(t, "config", "check", "--config", cfg)
		if res.killed != "" {
			t.Errorf("trace %s: config check killed: %s", c.trace, res.killed)
			continue
		}
		want := "warmstart: config " + cfg + ": key replay.trace: "
		if res.exitCode != 1 || !strings.HasPrefix(res.stderr, want) || !strings.Contains(res.stderr, c.trace) || !strings.Contains(res.stderr, c.want) {
			t.Errorf("trace %s: exit %d, stderr %q; want exit 1, %q... naming the path and %q", c.trace, res.exitCode, res.stderr, want, c.want)
		}
	}
}

// "config defaults --help" suggests writing the file warmstart reads.
func TestConfigDefaultsHelpNamesTheFileRead(t *testing.T) {
	res := runCLI(t, "config", "defaults", "--help")
	if res.code != 0 || !strings.Contains(res.stdout, "> "+config.SystemFile) {
		t.Errorf("exit %d, help %q; want it to suggest > %s", res.code, res.stdout, config.SystemFile)
	}
}

// TestConfigCheckRefusesADefaultDeviceTheVMMCannotUse: QEMU has no uffd
// backend, so a configuration that makes uffd the default device under
// QEMU fails every restore that names no device; config check says so,
// naming the key, and a file device passes.
func TestConfigCheckRefusesADefaultDeviceTheVMMCannotUse(t *testing.T) {
	dir := t.TempDir()
	for device, want := range map[string]string{"uffd": "key memory.device", "file": ""} {
		cfg := filepath.Join(dir, device+".toml")
		body := "[vmm]\ndriver = \"qemu\"\n[memory]\ndevice = \"" + device + "\"\n"
		if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		res := runCLIChild(t, "config", "check", "--config", cfg)
		switch {
		case want == "" && res.exitCode != 0:
			t.Errorf("device %s: exit %d, stderr %q; want ok", device, res.exitCode, res.stderr)
		case want != "" && (res.exitCode != 1 || !strings.Contains(res.stderr, want) || !strings.Contains(res.stderr, "qemu")):
			t.Errorf("device %s: exit %d, stderr %q; want exit 1 naming %s and qemu", device, res.exitCode, res.stderr, want)
		}
	}
}

// TestConfigCheckLoadsTheTrustKeys: every verb and the daemon refuse to
// run on a [trust] key file that fails its checks, so config check reads
// them too: a missing signing key, a private key open to others and a
// trusted key file that holds no key are each an error naming the key and
// the file (exit 1); good keys pass.
func TestConfigCheckLoadsTheTrustKeys(t *testing.T) {
	dir := t.TempDir()
	if _, err := trust.GenerateFiles(filepath.Join(dir, "publisher")); err != nil {
		t.Fatal(err)
	}
	good, pub := filepath.Join(dir, "publisher.key"), filepath.Join(dir, "publisher.pub")
	open := filepath.Join(dir, "open.key")
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(open, data, 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.pub")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ trust, key, path string }{
		{`signing_key = "` + filepath.Join(dir, "absent.key") + `"`, "trust.signing_key", "absent.key"},
		{`signing_key = "` + open + `"`, "trust.signing_key", open},
		{`trusted_keys = ["` + pub + `", "` + empty + `"]`, "trust.trusted_keys", empty},
		{`signing_key = "` + good + `"` + "\n" + `trusted_keys = ["` + pub + `"]`, "", ""},
	} {
		cfg := filepath.Join(dir, "warmstart.toml")
		if err := os.WriteFile(cfg, []byte("[trust]\n"+c.trust+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		res := runCLIChild(t, "config", "check", "--config", cfg)
		want := "warmstart: config " + cfg + ": key " + c.key + ": "
		switch {
		case res.killed != "":
			t.Errorf("%s: config check killed: %s", c.trust, res.killed)
		case c.key == "" && res.exitCode != 0:
			t.Errorf("%s: exit %d, stderr %q; want ok", c.trust, res.exitCode, res.stderr)
		case c.key != "" && (res.exitCode != 1 || !strings.HasPrefix(res.stderr, want) || !strings.Contains(res.stderr, c.path)):
			t.Errorf("%s: exit %d, stderr %q; want exit 1, %q... naming %s", c.trust, res.exitCode, res.stderr, want, c.path)
		}
	}
}

// TestConfigCheckReadsTheS3EndpointAndPrefix: an S3 endpoint of another
// scheme and a prefix with a '..' component are refused by every verb
// when it opens the repository; config check refuses them too, naming
// the key, instead of printing ok.
func TestConfigCheckReadsTheS3EndpointAndPrefix(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ line, key string }{
		{`endpoint = "ftp://127.0.0.1:9000"`, "backend.s3.endpoint"},
		{`prefix = "../other-tenant"`, "backend.s3.prefix"},
		{`prefix = "team/a"`, ""},
	} {
		cfg := filepath.Join(dir, "warmstart.toml")
		body := "[snapshot]\nrepository_backend = \"s3\"\n[backend.s3]\nbucket = \"snapshots\"\n" + c.line + "\n"
		if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		res := runCLIChild(t, "config", "check", "--config", cfg)
		want := "warmstart: config " + cfg + ": key " + c.key + ": "
		switch {
		case res.killed != "":
			t.Errorf("%s: config check killed: %s", c.line, res.killed)
		case c.key == "" && res.exitCode != 0:
			t.Errorf("%s: exit %d, stderr %q; want ok", c.line, res.exitCode, res.stderr)
		case c.key != "" && (res.exitCode != 1 || !strings.HasPrefix(res.stderr, want)):
			t.Errorf("%s: exit %d, stderr %q; want exit 1, %q...", c.line, res.exitCode, res.stderr, want)
		}
	}
}
