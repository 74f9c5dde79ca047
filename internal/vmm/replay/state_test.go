package replay

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/layout"
	"warmstart/internal/vmm"
)

// The replay VMM plays only the synthetic state: a QEMU stream, a
// Firecracker snapshot or any other file is refused, naming what it is and
// the driver key, before a child starts.
func TestRefusesForeignState(t *testing.T) {
	p := reference(t, 1)
	cases := map[string]struct {
		head  []byte
		found vmm.StateFormat
		hint  string
	}{
		"qemu":        {[]byte("QEVM\x00\x00\x00\x03\x07\x00"), vmm.FormatQEMU, `driver = "qemu"`},
		"firecracker": {[]byte{0, 0, 0x64, 0x86, 0x84, 0x19, 0x10, 0x07, 5, 0, 0, 0, 0, 0, 0, 0}, vmm.FormatFirecracker, `driver = "firecracker"`},
		"unknown":     {[]byte("hello"), vmm.FormatUnknown, ""},
		"empty":       {nil, vmm.FormatUnknown, ""},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), vmm.DiffVMStateFile)
			if err := os.WriteFile(state, c.head, 0o600); err != nil {
				t.Fatal(err)
			}
			spec := fileSpec(p.Memory, layout.Single(testMemoryBytes))
			spec.VMStatePath, spec.RuntimeDir = state, t.TempDir()
			v := &VMM{TracePath: p.Trace}
			inst, err := v.Start(t.Context(), spec)
			if err == nil {
				inst.Kill()
				<-inst.Exited()
				t.Fatal("a foreign state restored")
			}
			var fe *vmm.StateFormatError
			if !errors.As(err, &fe) || !errors.Is(err, vmm.ErrForeignState) || fe.Found != c.found || fe.Driver != DriverKey {
				t.Fatalf("err = %v, want a StateFormatError finding %s", err, c.found)
			}
			for _, want := range []string{`[vmm] driver = "replay"`, string(c.found), c.hint} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if entries, _ := os.ReadDir(spec.RuntimeDir); len(entries) != 0 {
				t.Errorf("the refused restore left %d files in its runtime directory: a child started", len(entries))
			}
		})
	}
}

// The synthetic state restores, as it always has.
func TestAcceptsSyntheticState(t *testing.T) {
	p := reference(t, 2)
	spec := fileSpec(p.Memory, layout.Single(testMemoryBytes))
	spec.VMStatePath = p.VMState
	inst := start(t, t.Context(), &VMM{TracePath: p.Trace}, spec)
	if _, err := inst.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
}
