package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/node"
	"warmstart/internal/trace"
)

// TestImportInterrupt signals snapshot import while it copies the memory
// file: it exits 128+signal and leaves the store as it was, with no
// snapshot directory, temporary file, record or alias of the publish.
func TestImportInterrupt(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(unix.SignalName(sig), func(t *testing.T) {
			store := t.TempDir()
			vmState, memory := largeSnapshotFiles(t)
			cli := startCLI(t, false, "snapshot", "import", "--store", store,
				"--vm-state", vmState, "--memory", memory, "--alias", "interrupted")
			cli.waitOutput("vm_state.bin: verify")
			cli.signal(sig)
			cli.wantExit(128+int(sig), sig)
			cli.wantNothingLeft(0)
			for _, dir := range []string{"snapshots", "catalog/records", "catalog/aliases"} {
				entries, err := os.ReadDir(filepath.Join(store, dir))
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range entries {
					t.Errorf("left in the store: %s/%s", dir, e.Name())
				}
			}
		})
	}
}

// TestVerifyInterrupt signals snapshot verify while it reads the memory
// file: it stops and exits 128+signal, saying so.
func TestVerifyInterrupt(t *testing.T) {
	store := t.TempDir()
	vmState, memory := largeSnapshotFiles(t)
	run := runCLI(t, "--config", noRecordingConfig(t), "snapshot", "import", "--store", store, "--vm-state", vmState, "--memory", memory, "--link")
	if run.code != 0 {
		t.Fatalf("import exited %d: %s", run.code, run.stderr)
	}
	cli := startCLI(t, false, "snapshot", "verify", "--store", store, strings.TrimSpace(run.stdout))
	cli.waitOutput("vm_state.bin: verify")
	cli.signal(syscall.SIGINT)
	cli.wantExit(130, syscall.SIGINT)
	cli.wantNothingLeft(0)
}

// largeSnapshotFiles writes a VM state file and a sparse 512 MiB memory
// file: large enough that copying, hashing or verifying the memory is
// still running when a signal arrives as the VM state file is done.
func largeSnapshotFiles(t *testing.T) (vmState, memory string) {
	t.Helper()
	src := t.TempDir()
	vmState = filepath.Join(src, "vm_state.bin")
	if err := os.WriteFile(vmState, []byte("vm state"), 0o644); err != nil {
		t.Fatal(err)
	}
	memory = filepath.Join(src, "memory.bin")
	if err := os.WriteFile(memory, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(memory, 512<<20); err != nil {
		t.Fatal(err)
	}
	return vmState, memory
}

// TestDeviceVerbInterrupt signals restore and record-manifest the moment
// their first memory device is mounted, long before the guest could be
// ready: each exits 128+signal and leaves no mount, runtime directory or
// process. A signal there once killed the process with its mounts left
// dead, and a restore interrupted later exited 1.
func TestDeviceVerbInterrupt(t *testing.T) {
	root := importedCLIRoot(t, "wsint-", 9, "slow")
	slow := slowTrace(t, root)
	for _, c := range []struct {
		name string
		args []string
	}{
		{"restore/SIGINT", []string{"restore", "slow", "--trace", slow}},
		{"restore/SIGTERM", []string{"restore", "slow", "--trace", slow}},
		{"record-manifest/SIGTERM", []string{"snapshot", "record-manifest", "slow", "--trace", slow}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sig := syscall.SIGTERM
			if strings.HasSuffix(c.name, "SIGINT") {
				sig = syscall.SIGINT
			}
			cli := startCLI(t, true, append([]string{"--config", root.cfg}, c.args...)...)
			own := filepath.Join(root.run, node.CLIDirPrefix+strconv.Itoa(cli.cmd.Process.Pid)) + "/"
			cli.waitMount("a memory device", func(p string) bool { return strings.HasPrefix(p, own) })
			cli.signal(sig)
			cli.wantExit(128+int(sig), sig)
			cli.wantNothingLeft(0)
			if ms := mountPointsBelow(t, root.run); len(ms) > 0 {
				t.Errorf("still mounted: %v", ms)
			}
			if entries, _ := os.ReadDir(root.run); len(entries) > 0 {
				t.Errorf("left in the runtime directory: %v", entries)
			}
		})
	}
}

// slowTrace writes the reference trace with a minute of guest compute
// before its first touch: a restore playing it is never ready within a
// test's signal.
func slowTrace(t *testing.T, root cliRoot) string {
	t.Helper()
	entries, err := trace.ReadFile(root.ref.Trace)
	if err != nil {
		t.Fatal(err)
	}
	entries[0].Compute += time.Minute
	path := filepath.Join(root.dir, "slow.trace")
	if err := trace.WriteFile(path, entries); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHeldRestoreEndsBySignal: a signal is how a held restore ends, so
// one that arrives while the VM is held stops it in order and the verb
// exits 0 with nothing left; sent to the whole process group, as a
// terminal's Ctrl-C is, it reaches warmstart alone, not the VMM, which
// warmstart stops in its own order.
func TestHeldRestoreEndsBySignal(t *testing.T) {
	root := importedCLIRoot(t, "wshs-", 11, "held")
	for _, device := range []string{"file", "uffd"} {
		t.Run(device, func(t *testing.T) {
			cli := startCLI(t, true, "--config", root.cfg, "restore", "held", "--hold", "--device", device, "--trace", root.ref.Trace)
			cli.waitOutput("holding the VM")
			cli.signalGroup(syscall.SIGINT)
			select {
			case <-cli.exited:
			case <-time.After(stopTimeout):
				t.Fatalf("still running %v after the signal", stopTimeout)
			}
			if cli.waitErr != nil {
				t.Errorf("held restore ended by SIGINT: %v, want exit 0; output:\n%s", cli.waitErr, cli.outputText())
			}
			cli.wantNothingLeft(0)
			if ms := mountPointsBelow(t, root.run); len(ms) > 0 {
				t.Errorf("still mounted: %v", ms)
			}
			if entries, _ := os.ReadDir(root.run); len(entries) > 0 {
				t.Errorf("left in the runtime directory: %v", entries)
			}
		})
	}
}

// TestSynthInterrupt signals synth while it writes a large memory file:
// it exits 128+signal and leaves no temporary file in its output
// directory.
func TestSynthInterrupt(t *testing.T) {
	out := filepath.Join(t.TempDir(), "ref")
	cli := startCLI(t, false, "synth", "--memory-size", "512MiB", "--out", out)
	cli.waitOutput("memory.bin: 128/512 MiB")
	cli.signal(syscall.SIGINT)
	cli.wantExit(128+int(syscall.SIGINT), syscall.SIGINT)
	cli.wantNothingLeft(0)
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in the output directory: %s", e.Name())
	}
}
