package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/reexec"
)

// Roles of the test binary besides warmstart's own (trials and replay VMMs
// the tests start re-execute this binary too).
const (
	// roleCLI makes the test binary run as the warmstart command itself,
	// with its arguments, so that a test sees what an operator would: the
	// exit code and both output streams.
	roleCLI = "test-cli"
	// roleCrashedCLI stands in for a CLI process killed with its FUSE
	// mounts up (runtime_test.go).
	roleCrashedCLI = "test-crashed-cli"
)

func TestMain(m *testing.M) {
	// No test, nor a CLI child it starts, reads the host's system
	// configuration file.
	config.SystemFile = ""
	roles.With(reexec.Roles{
		roleCLI:        func() int { main(); return 0 },
		roleCrashedCLI: func() int { return runCrashedCLI(os.Getenv(crashedCLIRootEnv)) },
	}).Dispatch()
	os.Exit(m.Run())
}

// cliEnv is the environment of a child playing the warmstart command.
func cliEnv(extra ...string) []string {
	return append(reexec.Environ(os.Environ(), roleCLI), extra...)
}

// noRecording is a configuration table that turns recording after
// publish off, for tests that import a snapshot only to restore it with
// the replay VMM (--trace), which a recording would not use.
const noRecording = "[manifest]\nrecord_after_publish = false\n"

// noRecordingConfig writes a configuration of noRecording alone, for
// verbs run with --store, and returns its path.
func noRecordingConfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "no-recording.toml")
	if err := os.WriteFile(path, []byte(noRecording), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// cliRun is what one warmstart process did.
type cliRun struct {
	stdout, stderr string
	code           int
}

// runCLI runs "warmstart ARGS..." as a child process and waits for it.
func runCLI(t *testing.T, args ...string) cliRun {
	t.Helper()
	return runCLIEnv(t, nil, args...)
}

// runCLIEnv is runCLI with extra environment variables (KEY=VALUE).
func runCLIEnv(t *testing.T, extra []string, args ...string) cliRun {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	// No race-detector pause at exit: it would only slow each child down.
	cmd.Env = cliEnv(append([]string{"GORACE=atexit_sleep_ms=0"}, extra...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var exit *exec.ExitError
	if err := cmd.Run(); err != nil && !errors.As(err, &exit) {
		t.Fatalf("run warmstart %q: %v", args, err)
	}
	return cliRun{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}
