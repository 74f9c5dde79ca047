package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/node"
	"warmstart/internal/reexec"
)

// crashedCLIRootEnv names the directory under which a child playing
// roleCrashedCLI mounts its devices in cli-<pid>, says so, and waits to be
// killed.
const crashedCLIRootEnv = "WARMSTART_CLI_TEST_CRASHED_ROOT"

func runCrashedCLI(root string) int {
	run := filepath.Join(root, node.CLIDirPrefix+strconv.Itoa(os.Getpid()))
	for _, name := range []string{"mem", "trace-mem"} {
		if _, err := fusedev.Mount(filepath.Join(run, name), fusedev.Options{}); err != nil {
			fmt.Println("ERROR", err)
			return 1
		}
	}
	fmt.Println("MOUNTED")
	io.Copy(io.Discard, os.Stdin) // until killed
	return 0
}

// TestSweepDeadCLIDirs kills a CLI stand-in with its mounts up, then
// sweeps: its directory and dead mounts go, everything else stays.
func TestSweepDeadCLIDirs(t *testing.T) {
	root := t.TempDir()
	t.Cleanup(func() {
		// Whatever failed, leave no dead mount behind.
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			for _, name := range []string{"trace-mem", "mem"} {
				unix.Unmount(filepath.Join(root, e.Name(), name), unix.MNT_DETACH)
			}
		}
	})
	dead, deadPID := killCLIWithMounts(t, root)
	keep := makeSweepSurvivors(t, root, deadPID)

	var logged bytes.Buffer
	node.SweepDeadCLIDirs(root, slog.New(slog.NewTextHandler(&logged, nil)))

	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the killed CLI's directory is still there (%v); log: %s", err, logged.String())
	}
	if mounts := mountPointsBelow(t, root); len(mounts) > 0 {
		t.Errorf("still mounted after the sweep: %v", mounts)
	}
	for _, name := range keep {
		if _, err := os.Stat(filepath.Join(root, name)); err != nil {
			t.Errorf("the sweep removed %s: %v", name, err)
		}
	}
	if !strings.Contains(logged.String(), "removed a dead CLI's runtime directory") {
		t.Errorf("the sweep logged %q", logged.String())
	}
}

// killCLIWithMounts starts a CLI stand-in that mounts two FUSE devices in
// its runtime directory under root, kills it once they are up and checks
// its mounts are dead; it returns the directory and the stand-in's pid.
func killCLIWithMounts(t *testing.T, root string) (string, int) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(reexec.Environ(os.Environ(), roleCrashedCLI), crashedCLIRootEnv+"="+root, "GORACE=atexit_sleep_ms=0")
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "MOUNTED\n" {
		child.Process.Kill()
		child.Wait()
		t.Fatalf("crashed CLI stand-in said %q (%v)", line, err)
	}
	child.Process.Kill()
	child.Wait()
	dead := filepath.Join(root, node.CLIDirPrefix+strconv.Itoa(child.Process.Pid))
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(dead, "mem"), &st); !errors.Is(err, unix.ENOTCONN) {
		t.Fatalf("statfs of the killed CLI's mount: %v, want ENOTCONN", err)
	}
	return dead, child.Process.Pid
}

// makeSweepSurvivors makes under root what a sweep must leave: this
// process's directory, a live process's (pid 1), names that are not a
// CLI's, and a file; it returns their names.
func makeSweepSurvivors(t *testing.T, root string, deadPID int) []string {
	t.Helper()
	keep := []string{node.CLIDirPrefix + strconv.Itoa(os.Getpid()), node.CLIDirPrefix + "1", node.CLIDirPrefix + "x", "initramfs", "daemon"}
	for _, name := range keep {
		if err := os.Mkdir(filepath.Join(root, name), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	file := node.CLIDirPrefix + strconv.Itoa(deadPID+1<<22) // beyond pid_max: no such process
	if err := os.WriteFile(filepath.Join(root, file), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return append(keep, file)
}

func mountPointsBelow(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}
