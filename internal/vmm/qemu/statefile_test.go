package qemu

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/layout"
	"warmstart/internal/vmm"
)

// QEMU takes only its own migration stream: a synthetic replay state, a
// Firecracker snapshot, an older stream version or anything else is
// refused, naming what it is and the driver key, before QEMU starts.
func TestRestoreRefusesForeignState(t *testing.T) {
	dir := t.TempDir()
	ran := filepath.Join(dir, "ran")
	bin := filepath.Join(dir, "qemu-system-x86_64")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\ntouch "+ran+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{Binary: bin, Accel: AccelTCG})
	if err != nil {
		t.Fatal(err)
	}
	mem := filepath.Join(dir, "memory.bin")
	if err := os.WriteFile(mem, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(mem, d.MemoryBytes()); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		head   string
		found  vmm.StateFormat
		detail string
	}{
		"replay":      {vmm.ReplayStateMagic + "\nseed 1\n", vmm.FormatReplay, `driver = "replay"`},
		"firecracker": {"\x00\x00\x64\x86\x84\x19\x10\x07\x05\x00\x00\x00\x00\x00\x00\x00", vmm.FormatFirecracker, `driver = "firecracker"`},
		"unknown":     {"not a vm state", vmm.FormatUnknown, "unknown format"},
		"version 2":   {"QEVM\x00\x00\x00\x02\x01", vmm.FormatQEMU, "stream version 2"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), vmm.DiffVMStateFile)
			if err := os.WriteFile(state, []byte(c.head), 0o600); err != nil {
				t.Fatal(err)
			}
			spec := vmm.RestoreSpec{SnapshotID: "s", Backend: vmm.BackendFile, MemPath: mem, VMStatePath: state,
				Layout: layout.Single(d.MemoryBytes()), RuntimeDir: t.TempDir()}
			_, err := d.Restore(t.Context(), spec)
			var fe *vmm.StateFormatError
			if !errors.As(err, &fe) || !errors.Is(err, vmm.ErrForeignState) || fe.Found != c.found {
				t.Fatalf("Restore = %v, want a refusal finding %s", err, c.found)
			}
			for _, want := range []string{`[vmm] driver = "qemu"`, c.detail} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if _, err := os.Stat(ran); err == nil {
				t.Fatal("QEMU was started for a state it cannot load")
			}
		})
	}
}
