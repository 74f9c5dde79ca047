package vmm_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/vmm"
)

// Every driver restores its own state format, and a refusal of a state
// file in that format by any other driver tells the operator to use it.
func TestEveryDriverIsNamedForItsFormat(t *testing.T) {
	samples := map[vmm.StateFormat][]byte{
		vmm.FormatReplay:      []byte(vmm.ReplayStateMagic + "\n"),
		vmm.FormatQEMU:        []byte("QEVM\x00\x00\x00\x03"),
		vmm.FormatFirecracker: binary.LittleEndian.AppendUint64(nil, vmm.FirecrackerMagic()),
	}
	dir := t.TempDir()
	seen := map[vmm.StateFormat]string{}
	for _, key := range vmm.Drivers() {
		format := vmm.DriverFormat(key)
		if other, dup := seen[format]; dup || format == vmm.FormatUnknown {
			t.Fatalf("driver %q restores %q (also the format of %q)", key, format, other)
		}
		seen[format] = key
		sample, ok := samples[format]
		if !ok {
			t.Fatalf("no sample state file of %s, the format of driver %q", format, key)
		}
		path := filepath.Join(dir, key)
		if err := os.WriteFile(path, sample, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, other := range vmm.Drivers() {
			_, err := vmm.CheckStateFormat(other, vmm.DriverFormat(other), path)
			hint := `restore it with [vmm] driver = "` + key + `" (--vmm ` + key + `)`
			switch {
			case other == key && err != nil:
				t.Errorf("driver %q refuses its own format: %v", key, err)
			case other != key && (err == nil || !strings.HasSuffix(err.Error(), hint)):
				t.Errorf("driver %q on a %s: %v, want the hint %q", other, format, err, hint)
			}
		}
	}
	if vmm.DriverFormat("kvmtool") != vmm.FormatUnknown {
		t.Error("a key no driver has restores a format")
	}
}
