package node_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/config"
	"warmstart/internal/node"
	"warmstart/internal/vmm/qemu"
)

// TestWithVMMMarksOnlyFlagMistakes: a missing --trace, one naming nothing,
// a directory, a FIFO or no startup trace, or an unknown --vmm is a
// *FlagError; a Firecracker without [agent] address is not, because the
// flags were spelled right.
func TestWithVMMMarksOnlyFlagMistakes(t *testing.T) {
	cfg := config.Default()
	cfg.Agent.Address = ""
	dir := t.TempDir()
	missing := filepath.Join(dir, "no-trace")
	notATrace := filepath.Join(dir, "notes.txt")
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notATrace, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A FIFO would block open(2) until a writer came; the check must not.
	t.Cleanup(func() { unblockFIFO(fifo) })
	for _, tc := range []struct {
		driver, trace string
		flagError     bool
	}{
		{config.DriverReplay, "", true},
		{"bochs", "", true},
		{config.DriverReplay, missing, true},
		{config.DriverReplay, fifo, true},
		{config.DriverReplay, dir, true},
		{config.DriverReplay, notATrace, true},
		{config.DriverFirecracker, "", false},
	} {
		_, err := node.WithVMM(cfg, tc.driver, tc.trace)
		fe := (*node.FlagError)(nil)
		if err == nil || errors.As(err, &fe) != tc.flagError {
			t.Errorf("%s %q: got %v, want flag error %v", tc.driver, tc.trace, err, tc.flagError)
		}
		if tc.trace == fifo && (err == nil || !strings.Contains(err.Error(), "not a regular file") || !strings.Contains(err.Error(), fifo)) {
			t.Errorf("fifo: got %v, want an error naming %s and \"not a regular file\"", err, fifo)
		}
	}
	c, err := node.WithVMM(cfg, config.DriverQEMU, "t")
	if err != nil || c.VMM.Driver != config.DriverQEMU || c.Replay.Trace != "t" || c == cfg {
		t.Fatalf("qemu: %+v, %v", c, err)
	}
}

// unblockFIFO opens fifo for writing without blocking, which releases a
// reader a broken check left blocked in open(2).
func unblockFIFO(fifo string) {
	if fd, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
		unix.Close(fd)
	}
}

// TestQEMUMachineTypesMatchTheDriver holds [qemu] machine's values to the
// driver's, which NewQEMU hands them to.
func TestQEMUMachineTypesMatchTheDriver(t *testing.T) {
	if config.MachineMicrovm != qemu.MachineMicrovm || config.MachinePC != qemu.MachinePC {
		t.Fatalf("config machines %q, %q; driver machines %q, %q",
			config.MachineMicrovm, config.MachinePC, qemu.MachineMicrovm, qemu.MachinePC)
	}
	if config.Default().QEMU.Machine != qemu.DefaultMachine {
		t.Fatalf("default machine %q, the driver's %q", config.Default().QEMU.Machine, qemu.DefaultMachine)
	}
}
