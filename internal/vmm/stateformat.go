package vmm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
)

// StateFormat is what a VM state file holds, told by its first bytes: each
// VMM writes its own format and refuses every other, so a snapshot taken
// with one VMM never "restores" under another.
type StateFormat string

const (
	// FormatReplay is the synthetic state `warmstart synth` writes (and
	// pause children of replay restores copy): it opens with
	// ReplayStateMagic.
	FormatReplay StateFormat = "synthetic replay state"
	// FormatQEMU is a QEMU migration stream, what `capture --vmm qemu`
	// saves: it opens with QEMU's file magic "QEVM" and its file version.
	FormatQEMU StateFormat = "QEMU migration stream"
	// FormatFirecracker is a Firecracker snapshot state file: it opens
	// with Firecracker's 64-bit magic id (little endian), then the
	// snapshot data version as a length-prefixed "MAJOR.MINOR.PATCH".
	FormatFirecracker StateFormat = "Firecracker snapshot"
	// FormatUnknown is anything else, an empty file included.
	FormatUnknown StateFormat = "unknown format"
)

// ReplayStateMagic opens the synthetic VM state, so nothing mistakes it
// for another VMM's state.
const ReplayStateMagic = "WARMSTART-SYNTHETIC-VMSTATE 1"

// QEMU's migration stream header: QEMU_VM_FILE_MAGIC then
// QEMU_VM_FILE_VERSION, both big endian. QEMU refuses any other version.
const (
	QEMUFileMagic   = "QEVM"
	QEMUFileVersion = 3
)

// Firecracker's snapshot magic ids (SNAPSHOT_MAGIC_ID in its
// src/vmm/src/snapshot/mod.rs), one per architecture. Firecracker loads
// only a state file whose first eight bytes, little endian, are its own
// architecture's id; the releases this project drives (1.12 on) write the
// id with its low 16 bits zero. The top 48 bits identify the family.
const (
	FirecrackerMagicX86   uint64 = 0x0710_1984_8664_0000
	FirecrackerMagicARM   uint64 = 0x0710_1984_AAAA_0000
	firecrackerFamilyMask uint64 = 0xFFFF_FFFF_FFFF_0000
)

// FirecrackerMagic is this host's architecture's Firecracker magic id.
func FirecrackerMagic() uint64 {
	if runtime.GOARCH == "arm64" {
		return FirecrackerMagicARM
	}
	return FirecrackerMagicX86
}

// stateHeadBytes is how much of a state file DetectStateFormat needs.
const stateHeadBytes = 64

// DetectStateFormat tells a state file's format from its first bytes.
func DetectStateFormat(head []byte) StateFormat {
	switch {
	case strings.HasPrefix(string(head), ReplayStateMagic):
		return FormatReplay
	case len(head) >= 8 && string(head[:4]) == QEMUFileMagic:
		return FormatQEMU
	case len(head) >= 8 && isFirecrackerFamily(binary.LittleEndian.Uint64(head)):
		return FormatFirecracker
	}
	return FormatUnknown
}

func isFirecrackerFamily(magic uint64) bool {
	m := magic & firecrackerFamilyMask
	return m == FirecrackerMagicX86 || m == FirecrackerMagicARM
}

// ReadStateHead returns up to the first 64 bytes of the state file at path.
func ReadStateHead(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read vm state: %w", err)
	}
	defer f.Close()
	head := make([]byte, stateHeadBytes)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read vm state %s: %w", path, err)
	}
	return head[:n], nil
}

// ErrForeignState is wrapped when a driver refuses a state file it could
// not have written: another VMM's, or no VMM's. It is the caller's choice
// of driver (or of snapshot) that is wrong, not the restore.
var ErrForeignState = errors.New("VM state not of the configured VMM")

// StateFormatError is a driver's refusal of a state file.
type StateFormatError struct {
	// Driver is the configured driver's key ([vmm] driver).
	Driver string
	// Found is the format the file holds; Want the one the driver takes.
	Found, Want StateFormat
	Path        string
	// Detail says more when the format is right but the header is not
	// (another architecture's Firecracker snapshot, a QEMU stream version).
	Detail string
}

func (e *StateFormatError) Error() string {
	msg := fmt.Sprintf("%v: [vmm] driver = %q restores %s; %s is %s", ErrForeignState, e.Driver, e.Want.withArticle(), e.Path, e.Found.withArticle())
	if e.Detail != "" {
		msg += " (" + e.Detail + ")"
	}
	if d := driverFor(e.Found); d != "" && d != e.Driver {
		msg += fmt.Sprintf(": restore it with [vmm] driver = %q (--vmm %s)", d, d)
	}
	return msg
}

func (e *StateFormatError) Unwrap() error { return ErrForeignState }

// withArticle is f in a sentence: "a QEMU migration stream".
func (f StateFormat) withArticle() string {
	if f == FormatUnknown {
		return "of an unknown format"
	}
	return "a " + string(f)
}

// StateChecker is implemented by drivers that check a state file's format
// before they start anything, as the real VMM refuses a state it did not
// write. Restores ask it before they attach the memory device.
type StateChecker interface {
	CheckState(path string) error
}

// CheckState asks v whether it could restore the state file at path; a
// driver that cannot tell is taken to be able.
func CheckState(v VMM, path string) error {
	if c, ok := v.(StateChecker); ok && path != "" {
		return c.CheckState(path)
	}
	return nil
}

// CheckStateFormat reads the head of the state file at path and refuses
// it, as driver, unless it is of format want. It returns the head for a
// driver's further checks.
func CheckStateFormat(driver string, want StateFormat, path string) ([]byte, error) {
	head, err := ReadStateHead(path)
	if err != nil {
		return nil, err
	}
	if got := DetectStateFormat(head); got != want {
		return nil, &StateFormatError{Driver: driver, Found: got, Want: want, Path: path}
	}
	return head, nil
}
