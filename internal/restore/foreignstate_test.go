package restore_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/restore"
	"warmstart/internal/vmm"
)

// A snapshot another VMM took (here a QEMU migration stream) is refused
// by the replay VMM before anything starts: no device attached, no VMM
// process, and the error says what the state is.
func TestRestoreRefusesAnotherVMMsState(t *testing.T) {
	e := newEnv(t, envOptions{noManifest: true})
	src := e.source(t)
	state := filepath.Join(t.TempDir(), "vm_state.bin")
	if err := os.WriteFile(state, []byte("QEVM\x00\x00\x00\x03\x07\x00\x00\x00"), 0o600); err != nil {
		t.Fatal(err)
	}
	src.VMStatePath, src.VMStateSHA256, src.VMStateSize = state, "", 0
	started := false
	e.vm.setBeforeStart(func() { started = true })
	inst, err := restoreCleanly(t, e.restorer, src, restore.Options{})
	if err == nil {
		stop(t, inst)
		t.Fatal("a QEMU stream restored under the replay VMM")
	}
	var fe *vmm.StateFormatError
	if !errors.As(err, &fe) || fe.Found != vmm.FormatQEMU || !errors.Is(err, vmm.ErrForeignState) {
		t.Fatalf("err = %v, want the replay VMM's refusal of a QEMU stream", err)
	}
	if started || len(e.vm.all()) != 0 {
		t.Error("the refused restore started a VMM")
	}
	if entries, err := os.ReadDir(e.srv.Dir()); err != nil || len(entries) != 0 {
		t.Errorf("the refused restore attached a device: %d entries in the mount (%v)", len(entries), err)
	}
}
