package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"warmstart/internal/reexec"

	"golang.org/x/sys/unix"
)

// TestCISweepMountsStaysUnderItsRoot runs the sweep that .ci/run's exit trap
// runs on its temporary root, with live warmstart FUSE mounts below that
// root and in a directory next to it whose name merely starts the same: the
// mounts below it are reported and detached, the others stay.
func TestCISweepMountsStaysUnderItsRoot(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("FUSE mounts need /dev/fuse: %v", err)
	}
	base := t.TempDir()
	root, next := filepath.Join(base, "ci"), filepath.Join(base, "ci-other")
	t.Cleanup(func() {
		// Detach whatever is still mounted here: all of it is this test's.
		for _, m := range slices.Backward(mountPointsBelow(t, base)) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
	})
	below := startMountingCLI(t, root)
	beside := startMountingCLI(t, next)

	out, err := exec.Command("bash", "../../.ci/sweep-mounts", root).CombinedOutput()
	if err != nil {
		t.Fatalf("sweep-mounts: %v\n%s", err, out)
	}
	if left := mountPointsBelow(t, root); len(left) > 0 {
		t.Errorf("still mounted under the swept root: %v", left)
	}
	if got := mountPointsBelow(t, next); !slices.Equal(got, beside) {
		t.Errorf("mounted next to the swept root: %v, want %v untouched", got, beside)
	}
	for _, m := range below {
		if !strings.Contains(string(out), m) {
			t.Errorf("the sweep did not report %s:\n%s", m, out)
		}
	}
	for _, m := range beside {
		if strings.Contains(string(out), m) {
			t.Errorf("the sweep reported %s, which is not under its root:\n%s", m, out)
		}
	}

	out, err = exec.Command("bash", "../../.ci/sweep-mounts", root).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("second sweep with nothing left: %v, %q; want silence and success", err, out)
	}
}

// startMountingCLI starts the crashed-CLI stand-in (runtime_test.go), which
// mounts two warmstart FUSE file systems under root and stays up until the
// test ends. It returns their mount points, sorted.
func startMountingCLI(t *testing.T, root string) []string {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(reexec.Environ(os.Environ(), roleCrashedCLI), crashedCLIRootEnv+"="+root, "GORACE=atexit_sleep_ms=0")
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		child.Process.Kill()
		child.Wait()
	})
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "MOUNTED\n" {
		t.Fatalf("mounting stand-in said %q (%v)", line, err)
	}
	mounts := mountPointsBelow(t, root)
	slices.Sort(mounts)
	if len(mounts) != 2 {
		t.Fatalf("the stand-in mounted %v under %s, want two mounts", mounts, root)
	}
	return mounts
}
