package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/vmm/qemu/qemutest"
)

// TestCaptureInterruptDuringAcceleratorProbe: the first capture on a host
// boots a probe guest under KVM to choose the accelerator, which on a host
// whose KVM cannot boot the guest runs until its 30 s bound. A signal then
// must end the capture at once (exit 130), as at any other point, not
// after the probe has run its course.
func TestCaptureInterruptDuringAcceleratorProbe(t *testing.T) {
	qemutest.RequireGuest(t)
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Skip("no /dev/kvm: the accelerator is chosen without a probe boot")
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "warmstart.toml")
	body := "[backend.posix_fs]\nsnapshot_store = \"" + filepath.Join(dir, "store") + "\"\n" +
		"[runtime]\ndir = \"" + filepath.Join(dir, "run") + "\"\n" + // no probe verdict cached
		"[manifest]\nrecord_after_publish = false\n"
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startCLI(t, false, "--config", cfg, "capture")
	if !waitForKVMProbe(t, c.cmd.Process.Pid, c.exited) {
		t.Skip("the capture got past the accelerator probe before it was seen (KVM boots guests here)")
	}
	c.signal(syscall.SIGINT)
	c.wantExit(128+int(syscall.SIGINT), syscall.SIGINT)
	if took := time.Since(c.signaled); took > 10*time.Second {
		t.Errorf("capture ended %v after SIGINT during the accelerator probe; want it within seconds", took.Round(time.Second))
	}
	c.wantNothingLeft(5 * time.Second)
}

// waitForKVMProbe polls until a child of pid runs QEMU with "-accel kvm"
// (the probe boot), reporting false if done is closed first; it fails the
// test if neither happens within reachTimeout.
func waitForKVMProbe(t *testing.T, pid int, done <-chan struct{}) bool {
	t.Helper()
	deadline := time.After(reachTimeout)
	for {
		if childRunsKVMProbe(pid) {
			return true
		}
		select {
		case <-done:
			return false
		case <-deadline:
			t.Fatalf("no accelerator probe seen after %v", reachTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// childRunsKVMProbe reports whether a child of pid runs QEMU under KVM.
// Each thread lists the children it started, so every thread is read.
func childRunsKVMProbe(pid int) bool {
	lists, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var children []string
	for _, l := range lists {
		b, _ := os.ReadFile(l)
		children = append(children, strings.Fields(string(b))...)
	}
	for _, child := range children {
		cmdline, _ := os.ReadFile("/proc/" + child + "/cmdline")
		if bytes.Contains(cmdline, []byte("-accel\x00kvm")) {
			return true
		}
	}
	return false
}
