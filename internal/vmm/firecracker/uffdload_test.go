package firecracker_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/layout"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/prefetch"
	"warmstart/internal/restore"
	"warmstart/internal/vmm/firecracker"
)

// TestUffdRestoreServesTheLoadsFaults restores on the uffd device with a
// fake Firecracker playing 1.16.1, which like the real one writes a new VM
// generation ID into guest memory inside PUT /snapshot/load and, resuming
// the VM, lets the guest run before it answers: the page-fault handler
// must serve from before the load is sent, or the load never answers. The
// restore must be ready well within the load timeout, with the guest
// finding the snapshot's bytes on the generation ID's page and on every
// page it reads.
func TestUffdRestoreServesTheLoadsFaults(t *testing.T) {
	touched := []int64{0, 2 << 20, 7<<20 + 4096}
	token := rand.Text()
	cfg := firecracker.FakeConfig{Version: "1.16.1", Agent: true, TouchPages: touched}
	// A load waiting for a handler that does not serve yet fails at the
	// load timeout, well within the test's own bound.
	r, src := uffdSetup(t, cfg, 10*time.Second, 16, 16, token, touched)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inst, err := r.Restore(ctx, src, restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOff})
	if err != nil {
		t.Fatal(err)
	}
	answer := inst.Ready.Detail.AgentAnswer
	reads := inst.DeviceBytes.ReadRequests
	if err := inst.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(strings.TrimSpace(answer), " token "+token) {
		t.Errorf("the restored agent answered %q; the snapshot holds token %s", answer, token)
	}
	// The generation ID's page, faulted by the load, and the guest's.
	if want := uint64(len(touched) + 1); reads < want {
		t.Errorf("the device served %d faults, want at least %d", reads, want)
	}
	t.Logf("ready after %v (VM started after %v), %d faults served", inst.Timings.Ready, inst.Timings.VMStarted, reads)
}

// uffdSetup is a restorer on fake Firecracker cfg with load timeout
// loadTimeout, and a snapshot for it whose VM state says stateMiB of
// memory and whose memory file has memMiB, with token's markers on pages.
func uffdSetup(t *testing.T, cfg firecracker.FakeConfig, loadTimeout time.Duration, stateMiB, memMiB int64, token string, pages []int64) (*restore.Restorer, restore.Source) {
	t.Helper()
	// A short root keeps socket paths within the Unix limit.
	dir, err := os.MkdirTemp("", "wsfc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	vmState, mem := firecracker.WriteFakeSnapshot(t, dir, stateMiB, token, pages)
	if err := os.Truncate(mem, memMiB<<20); err != nil {
		t.Fatal(err)
	}
	d, err := firecracker.New(firecracker.Options{
		Binary:       firecracker.FakeBinary(t, cfg),
		EnvdAddress:  "unix:agent.sock",
		PollInterval: 2 * time.Millisecond,
		ReadyTimeout: 20 * time.Second,
		LoadTimeout:  loadTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &restore.Restorer{Devices: memdev.Devices{uffd.NewOpener(0)}, Engine: prefetch.NewEngine(prefetch.Options{}), VMM: d, RuntimeDir: filepath.Join(dir, "run")}
	src := restore.Source{SnapshotID: "fc-uffd", VMStatePath: vmState, Memory: memdev.File(mem), Layout: layout.Single(memMiB << 20)}
	return r, src
}

// uffdFailure restores on the uffd device as uffdSetup sets up, with a
// load timeout of a minute, expecting the restore to fail; it returns how
// long the restore took to fail, and its error.
func uffdFailure(t *testing.T, cfg firecracker.FakeConfig, stateMiB, memMiB int64) (time.Duration, error) {
	t.Helper()
	r, src := uffdSetup(t, cfg, time.Minute, stateMiB, memMiB, rand.Text(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	inst, err := r.Restore(ctx, src, restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOff})
	took := time.Since(t0)
	if err == nil {
		inst.Stop(ctx)
		t.Fatal("the restore succeeded")
	}
	if left, _ := filepath.Glob(filepath.Join(r.RuntimeDir, "restores", "*", "*.sock")); len(left) > 0 {
		t.Errorf("sockets left behind: %v", left)
	}
	return took, err
}

// failFast bounds how long a restore whose load cannot finish may take to
// fail: far below the load timeout, and wide enough for a loaded host to
// start, kill and reap a VMM.
const failFast = 8 * time.Second

// TestUffdRestoreEndsWhenTheHandlerRefusesTheVMM: the handler refuses the
// regions Firecracker sends inside its load (they run past the memory
// file), so nothing will serve the load's faults. The restore must end at
// once, not at the load timeout, with the handler's reason.
func TestUffdRestoreEndsWhenTheHandlerRefusesTheVMM(t *testing.T) {
	took, err := uffdFailure(t, firecracker.FakeConfig{Version: "1.16.1"}, 16, 8)
	t.Logf("failed after %v: %v", took, err)
	if !strings.Contains(err.Error(), "accept the VMM's userfaultfd") || !strings.Contains(err.Error(), "bad uffd handshake") {
		t.Errorf("error %q does not say the handler refused the VMM's handshake", err)
	}
	if took > failFast {
		t.Errorf("failed after %v, want within %v", took, failFast)
	}
}

// TestUffdRestoreEndsWhenTheVMMDiesInTheLoad: Firecracker crashes inside
// its load, after handing over its memory. The restore must end at once
// with the VMM's exit and its last log line, not blame the handler.
func TestUffdRestoreEndsWhenTheVMMDiesInTheLoad(t *testing.T) {
	took, err := uffdFailure(t, firecracker.FakeConfig{Version: "1.16.1", CrashInLoad: true}, 16, 16)
	t.Logf("failed after %v: %v", took, err)
	if !errors.Is(err, firecracker.ErrExited) || errors.Is(err, firecracker.ErrHandlerDied) ||
		!strings.Contains(err.Error(), "exit status 1") || !strings.Contains(err.Error(), "simulated crash") {
		t.Errorf("error %q: want the VMM's exit with status 1 and its log line, not a dead handler", err)
	}
	if took > failFast {
		t.Errorf("failed after %v, want within %v", took, failFast)
	}
}
