package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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
	run := runCLI(t, "snapshot", "import", "--store", store, "--vm-state", vmState, "--memory", memory, "--link")
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
