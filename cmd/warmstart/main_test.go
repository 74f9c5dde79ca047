package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"testing"
)

// cliMainEnv makes the test binary run as the warmstart command itself, with
// its arguments, so that a test sees what an operator would: the exit code
// and both output streams. Trials and replay VMMs it starts re-execute this
// binary too; their roles are taken in init, before TestMain.
const cliMainEnv = "WARMSTART_CLI_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(cliMainEnv) == "1" {
		os.Unsetenv(cliMainEnv)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// cliRun is what one warmstart process did.
type cliRun struct {
	stdout, stderr string
	code           int
}

// runCLI runs "warmstart ARGS..." as a child process and waits for it.
func runCLI(t *testing.T, args ...string) cliRun {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	// No race-detector pause at exit: it would only slow each child down.
	cmd.Env = append(os.Environ(), cliMainEnv+"=1", "GORACE=atexit_sleep_ms=0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var exit *exec.ExitError
	if err := cmd.Run(); err != nil && !errors.As(err, &exit) {
		t.Fatalf("run warmstart %q: %v", args, err)
	}
	return cliRun{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}
