package bench

import (
	"strings"
	"testing"

	"warmstart/internal/config"
)

func validFlags() Flags {
	return Flags{Options: Options{Blocks: 2, ReserveBlocks: 1, Device: config.DeviceFile, Concurrency: 1},
		PolicyList: " seed, warmstart ,", MemorySize: "64MiB", Repository: "posix_fs"}
}

// TestFlagsCheckCompletesOptions: the policy list is split and trimmed,
// the hot control follows --no-hot and the memory size is parsed.
func TestFlagsCheckCompletesOptions(t *testing.T) {
	f := validFlags()
	size, err := f.Check("")
	if err != nil || size != 64<<20 || !f.Hot || strings.Join(f.Policies, "|") != "seed|warmstart" {
		t.Fatalf("Check: size %d, hot %v, policies %q, %v", size, f.Hot, f.Policies, err)
	}
}

// TestFlagsCheckNamesTheFlag: every refused value names its flag.
func TestFlagsCheckNamesTheFlag(t *testing.T) {
	for want, edit := range map[string]func(*Flags){
		"--blocks":           func(f *Flags) { f.Blocks = 0 },
		"--blocks 1001":      func(f *Flags) { f.Blocks = MaxBlocks + 1 },
		"--reserve-blocks":   func(f *Flags) { f.ReserveBlocks = MaxBlocks + 1 },
		"--memory-size 1":    func(f *Flags) { f.MemorySize = "1" },
		"--device":           func(f *Flags) { f.Device = "disk" },
		"--io-engine":        func(f *Flags) { f.IOEngine = 9 },
		"--io-engine 2":      func(f *Flags) { f.IOEngine, f.Device = 2, config.DeviceUffd },
		"--policies":         func(f *Flags) { f.PolicyList = "nope" },
		"--memory-size":      func(f *Flags) { f.MemorySize = "lots" },
		"--repository \"x\"": func(f *Flags) { f.Repository = "x" },
		"--repository s3":    func(f *Flags) { f.Repository = "s3" },
		// Refused before the reference snapshot is synthesized and its
		// manifest recorded, as a usage error, not after.
		"--concurrency -3": func(f *Flags) { f.Concurrency = -3 },
		// 0 would be read as 1 by Options; on the command line it is a
		// value the help does not offer.
		"--concurrency 0":  func(f *Flags) { f.Concurrency = 0 },
		"--concurrency 17": func(f *Flags) { f.Concurrency = MaxConcurrency + 1 },
	} {
		f := validFlags()
		edit(&f)
		if _, err := f.Check(""); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
	if err := CheckReferenceVMM("", config.DriverFirecracker, 0); err == nil || !strings.Contains(err.Error(), "--vmm firecracker") {
		t.Errorf("reference snapshot under firecracker: %v", err)
	}
	if err := CheckReferenceVMM("snap", config.DriverFirecracker, 0); err != nil {
		t.Errorf("named snapshot under firecracker: %v", err)
	}
}
