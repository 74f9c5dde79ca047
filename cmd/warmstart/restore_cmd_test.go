package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/lab/synth"
	"warmstart/internal/node"
)

// verbTimeout bounds a verb run as a separate process.
const verbTimeout = time.Minute

// verbProcess is "warmstart ARGS..." started as a separate process (see
// roleCLI) that the test talks to while it runs: its standard output is
// a pipe, its standard error is kept.
type verbProcess struct {
	cmd    *exec.Cmd
	stdout io.Reader
	stderr bytes.Buffer
}

func startVerb(t *testing.T, args ...string) *verbProcess {
	t.Helper()
	p := &verbProcess{cmd: exec.Command(os.Args[0], args...)}
	// No race-detector pause at exit: it would only slow the child down.
	p.cmd.Env = cliEnv("GORACE=atexit_sleep_ms=0")
	p.cmd.Stderr = &p.stderr
	// A verb whose test died must not keep its VM and mount.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var err error
	if p.stdout, err = p.cmd.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return p
}

// wait reads the rest of standard output and waits for the process to
// exit, killing it if it has not within verbTimeout.
func (p *verbProcess) wait(t *testing.T, rest io.Reader) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		io.Copy(io.Discard, rest)
		done <- p.cmd.Wait()
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(verbTimeout):
		p.cmd.Process.Kill()
		<-done
		t.Fatalf("warmstart %s did not exit within %v; stderr:\n%s", strings.Join(p.cmd.Args[1:], " "), verbTimeout, p.stderr.String())
		return nil
	}
}

// TestRestoreHoldReportsVMExit runs "warmstart restore --hold" as its own
// process and kills its VMM after ready: the verb must say the VM exited,
// with the signal, exit 1, and leave no VMM process, runtime directory or
// FUSE mount behind.
func TestRestoreHoldReportsVMExit(t *testing.T) {
	// The uffd socket path is short only under a short root.
	root := importedCLIRoot(t, "wshold-", 5, "held")
	for _, device := range []string{"file", "uffd"} {
		t.Run(device, func(t *testing.T) { checkHeldVMExit(t, root, device) })
	}
}

// cliRoot is a short temporary root holding a reference snapshot's files
// and a configuration whose store and runtime directory are under it.
type cliRoot struct {
	dir, run, cfg string
	ref           synth.Paths
	layout        string // the reference's memory layout, as --layout takes it
}

// newCLIRoot generates the reference of seed under a new root named with
// prefix; its cleanup unmounts whatever a verb left mounted under run.
func newCLIRoot(t *testing.T, prefix string, seed uint64) cliRoot {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(dir, "run")
	t.Cleanup(func() {
		// A verb killed by a failing test leaves dead mounts behind.
		for _, m := range mountPointsBelow(t, run) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
		os.RemoveAll(dir)
	})
	ref, err := synth.Generate(context.Background(), synth.Options{MemoryBytes: 16 << 20, Seed: seed, Dir: filepath.Join(dir, "ref")})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(ref.Layout)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "warmstart.toml")
	cfgText := fmt.Sprintf("[backend.posix_fs]\nsnapshot_store = %q\n[runtime]\ndir = %q\n", filepath.Join(dir, "store"), run)
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o644); err != nil {
		t.Fatal(err)
	}
	return cliRoot{dir: dir, run: run, cfg: cfgPath, ref: ref, layout: strings.TrimSpace(string(spec))}
}

// importedCLIRoot is newCLIRoot with its reference imported under alias.
func importedCLIRoot(t *testing.T, prefix string, seed uint64, alias string) cliRoot {
	t.Helper()
	root := newCLIRoot(t, prefix, seed)
	if _, _, err := runVerb(t, "--config", root.cfg, "snapshot", "import", "--vm-state", root.ref.VMState, "--memory", root.ref.Memory,
		"--alias", alias, "--layout", root.layout); err != nil {
		t.Fatalf("import: %v", err)
	}
	return root
}

// checkHeldVMExit runs "restore held --hold" on device as its own process
// and kills its VMM after ready: the verb must exit 1 naming the signal
// and leave no VMM process, runtime directory or mount.
func checkHeldVMExit(t *testing.T, root cliRoot, device string) {
	cli := startVerb(t, "--config", root.cfg, "restore", "held", "--hold", "--json", "--device", device, "--trace", root.ref.Trace)
	dec := json.NewDecoder(cli.stdout)
	var report struct {
		Ready map[string]string `json:"ready"`
	}
	if err := dec.Decode(&report); err != nil {
		cli.cmd.Process.Kill()
		cli.wait(t, cli.stdout)
		t.Fatalf("restore --hold printed no report (%v); stderr:\n%s", err, cli.stderr.String())
	}
	vmPID, err := strconv.Atoi(report.Ready["pid"])
	if err != nil {
		t.Fatalf("report's ready detail %v has no VMM pid", report.Ready)
	}
	if err := syscall.Kill(vmPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	err = cli.wait(t, io.MultiReader(dec.Buffered(), cli.stdout))
	checkVerbReportedExit(t, err, cli.stderr.String())
	if err := syscall.Kill(vmPID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("VMM pid %d: signal 0 gave %v, want ESRCH", vmPID, err)
	}
	cliDir := filepath.Join(root.run, node.CLIDirPrefix+strconv.Itoa(cli.cmd.Process.Pid))
	if _, err := os.Stat(cliDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the verb's runtime directory %s is still there (%v)", cliDir, err)
	}
	if ms := mountPointsBelow(t, root.run); len(ms) > 0 {
		t.Errorf("still mounted after the verb exited: %v", ms)
	}
}

// checkVerbReportedExit: the verb ended with exit status 1 and its error,
// main's last line, names the VM's exit and its signal.
func checkVerbReportedExit(t *testing.T, err error, stderr string) {
	t.Helper()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
		t.Fatalf("restore --hold after its VM was killed: %v, want exit status 1; stderr:\n%s", err, stderr)
	}
	// The verb's error, main's last line, names the exit and its signal.
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "warmstart: restore ") ||
		!strings.Contains(last, "the VM exited after ready: killed by signal 9 (killed)") {
		t.Errorf("last line of stderr %q does not report the exit and its signal; stderr:\n%s", last, stderr)
	}
}
