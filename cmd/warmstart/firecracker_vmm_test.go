package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warmstart/internal/cli"
	"warmstart/internal/config"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/node"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/firecracker"
)

func TestFirecrackerDriverFromConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Firecracker.Binary = "/opt/firecracker"
	cfg.Firecracker.StopTimeout = 7 * time.Second
	cfg.Envd = config.EnvdConfig{Address: "vsock:49983", PollInterval: 3 * time.Millisecond, Timeout: 9 * time.Second}
	vf := cli.VMMFlags{Kind: "firecracker"}
	vm, err := buildVMM(vf, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := vm.(*firecracker.Driver)
	if !ok {
		t.Fatalf("--vmm firecracker built a %T", vm)
	}
	o := d.Options()
	if o.Binary != "/opt/firecracker" || o.EnvdAddress != "vsock:49983" || !o.Vsock ||
		o.PollInterval != 3*time.Millisecond || o.ReadyTimeout != 9*time.Second || o.StopTimeout != 7*time.Second {
		t.Errorf("driver options %+v do not follow [firecracker] and [envd]", o)
	}
	if node.FUSEOptions(fusedev.Options{}, vm).AllowWriteOpen {
		t.Error("Firecracker opens its memory file read-only, yet the FUSE mount lets it be opened for writing")
	}

	cfg.Envd.Address = ""
	if _, err := buildVMM(vf, cfg); err == nil || !strings.Contains(err.Error(), "[envd] address") {
		t.Errorf("without an [envd] address: %v, want an error naming it", err)
	}
}

// TestCaptureFirecrackerFailsCleanly runs "warmstart capture --vmm
// firecracker" with a Firecracker binary that dies at start: the verb must
// get as far as spawning it with the configured kernel, report its
// output, publish nothing and leave no mount, socket or runtime directory.
// Without a kernel configured it must refuse before spawning anything.
func TestCaptureFirecrackerFailsCleanly(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("the FUSE memory device needs /dev/fuse: %v", err)
	}
	fc := newDyingFirecracker(t)

	_, err := runGuestVerb(t, "--config", fc.writeConfig(t, ""), "capture", "--vmm", "firecracker")
	if err == nil || !strings.Contains(err.Error(), "[firecracker] kernel") {
		t.Fatalf("capture without a kernel: %v, want an error naming [firecracker] kernel", err)
	}
	if _, err := os.Stat(fc.spawned); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("firecracker was spawned without a kernel (stat: %v)", err)
	}

	_, err = runGuestVerb(t, "--config", fc.writeConfig(t, fc.kernel), "capture", "--vmm", "firecracker", "--alias", "never")
	if err == nil || !strings.Contains(err.Error(), "kernel image is corrupt") {
		t.Fatalf("capture with a dying firecracker: %v, want its output in the error", err)
	}
	args, err := os.ReadFile(fc.spawned)
	if err != nil || !strings.Contains(string(args), "--api-sock "+fc.run+"/") {
		t.Errorf("firecracker ran with %q (%v), want its API socket under the runtime directory %s", args, err, fc.run)
	}
	fc.checkNothingLeft(t)
}

// dyingFirecracker is a short temporary root holding a Firecracker binary
// that records its arguments in spawned and dies at start, an empty
// kernel, and the store and runtime directories a capture uses.
type dyingFirecracker struct {
	dir, spawned, bin, kernel, store, run string
}

func newDyingFirecracker(t *testing.T) dyingFirecracker {
	t.Helper()
	dir, err := os.MkdirTemp("", "wsfccli-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	fc := dyingFirecracker{
		dir: dir, spawned: filepath.Join(dir, "spawned"), bin: filepath.Join(dir, "firecracker"),
		kernel: filepath.Join(dir, "vmlinux"), store: filepath.Join(dir, "store"), run: filepath.Join(dir, "run"),
	}
	script := "#!/bin/sh\necho \"$@\" > " + fc.spawned + "\necho 'kernel image is corrupt' >&2\nexit 1\n"
	if err := os.WriteFile(fc.bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fc.kernel, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return fc
}

// writeConfig writes the configuration naming the binary and kernel
// (empty: none configured) and returns its path.
func (fc dyingFirecracker) writeConfig(t *testing.T, kernel string) string {
	t.Helper()
	cfg := filepath.Join(fc.dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(`
[backend.posix_fs]
snapshot_store = "`+fc.store+`"

[runtime]
dir = "`+fc.run+`"

[firecracker]
binary = "`+fc.bin+`"
kernel = "`+kernel+`"

[envd]
address = "unix:agent.sock"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// checkNothingLeft: the failed capture published no record and left no
// staging, runtime directory or mount.
func (fc dyingFirecracker) checkNothingLeft(t *testing.T) {
	t.Helper()
	repo, err := posixfs.Open(fc.store, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if recs, err := repo.List(context.Background(), repository.Filter{}); err != nil || len(recs) > 0 {
		t.Errorf("records after a failed capture: %v (%v)", recs, err)
	}
	if left, _ := filepath.Glob(filepath.Join(fc.store, ".capture-*")); len(left) > 0 {
		t.Errorf("staging left behind: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(fc.run, "cli-*")); len(left) > 0 {
		t.Errorf("runtime directories left behind: %v", left)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), " "+fc.dir) {
		t.Errorf("still mounted under %s:\n%s", fc.dir, mounts)
	}
}

// buildVMM is the driver the CLI builds for vf over cfg.
func buildVMM(vf cli.VMMFlags, cfg *config.Config) (vmm.VMM, error) {
	c, err := node.WithVMM(cfg, vf.Kind, vf.Trace)
	if err != nil {
		return nil, err
	}
	return node.NewVMM(context.Background(), c)
}
