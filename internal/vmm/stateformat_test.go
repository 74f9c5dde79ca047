package vmm_test

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/vmm"
)

func TestDetectStateFormat(t *testing.T) {
	fc := func(magic uint64) []byte { return binary.LittleEndian.AppendUint64(nil, magic) }
	for name, c := range map[string]struct {
		head []byte
		want vmm.StateFormat
	}{
		"synthetic":         {[]byte(vmm.ReplayStateMagic + "\nseed 1\n"), vmm.FormatReplay},
		"qemu capture":      {[]byte("QEVM\x00\x00\x00\x03\x07"), vmm.FormatQEMU},
		"firecracker x86":   {fc(vmm.FirecrackerMagicX86), vmm.FormatFirecracker},
		"firecracker arm":   {fc(vmm.FirecrackerMagicARM), vmm.FormatFirecracker},
		"firecracker older": {fc(vmm.FirecrackerMagicX86 | 2), vmm.FormatFirecracker},
		"qemu magic alone":  {[]byte("QEVM"), vmm.FormatUnknown},
		"magic cut short":   {[]byte(vmm.ReplayStateMagic[:10]), vmm.FormatUnknown},
		"json":              {[]byte(`{"vcpu_count":1}`), vmm.FormatUnknown},
		"empty":             {nil, vmm.FormatUnknown},
	} {
		if got := vmm.DetectStateFormat(c.head); got != c.want {
			t.Errorf("%s: %s, want %s", name, got, c.want)
		}
	}
}

// A refusal names the driver key, what the file is and which driver
// restores it; a file no driver restores gets no such hint.
func TestCheckStateFormatRefusal(t *testing.T) {
	dir := t.TempDir()
	qemu, junk := filepath.Join(dir, "qemu"), filepath.Join(dir, "junk")
	if err := os.WriteFile(qemu, []byte("QEVM\x00\x00\x00\x03"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(junk, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := vmm.CheckStateFormat("qemu", vmm.FormatQEMU, qemu); err != nil {
		t.Fatalf("a QEMU stream refused by qemu: %v", err)
	}
	_, err := vmm.CheckStateFormat("firecracker", vmm.FormatFirecracker, qemu)
	want := `[vmm] driver = "firecracker" restores a Firecracker snapshot; ` + qemu +
		` is a QEMU migration stream: restore it with [vmm] driver = "qemu" (--vmm qemu)`
	if !errors.Is(err, vmm.ErrForeignState) || !strings.Contains(err.Error(), want) {
		t.Errorf("refusal = %v, want it to say %q", err, want)
	}
	_, err = vmm.CheckStateFormat("replay", vmm.FormatReplay, junk)
	if !errors.Is(err, vmm.ErrForeignState) || !strings.HasSuffix(err.Error(), junk+" is of an unknown format") {
		t.Errorf("refusal of junk = %v", err)
	}
	if _, err := vmm.CheckStateFormat("replay", vmm.FormatReplay, filepath.Join(dir, "absent")); err == nil || errors.Is(err, vmm.ErrForeignState) {
		t.Errorf("a missing file: %v, want a read error, not a refusal", err)
	}
}
