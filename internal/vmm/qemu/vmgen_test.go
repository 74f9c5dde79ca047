package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"warmstart/internal/vmm"
)

// restoreTwice restores f's snapshot twice with d, each time from its own
// copy of the memory, stops each guest once it is ready and returns what
// each reported at ready.
func restoreTwice(t *testing.T, d *Driver, f *fixture) [2]vmm.ReadyInfo {
	t.Helper()
	var infos [2]vmm.ReadyInfo
	for i := range infos {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("run%d", i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		mem := filepath.Join(dir, "memory.bin")
		f.copyMemory(t, mem)
		m, info := restoreReady(t, d, f, dir, mem)
		infos[i] = info
		if err := m.RequestStop(); err != nil {
			t.Fatal(err)
		}
		if err := m.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return infos
}

// TestRestoresOfOneSnapshotDrawDifferentRandomBytes: two restores of one
// snapshot must not share their guest's RNG state. The agent draws bytes
// from the guest kernel's RNG after each resume; on the microvm, which has
// no generation ID device, the host's entropy that every ping carries is
// what makes them differ.
func TestRestoresOfOneSnapshotDrawDifferentRandomBytes(t *testing.T) {
	f := captured(t)
	d := requireQEMU(t)
	infos := restoreTwice(t, d, f)
	for i, info := range infos {
		if got := info.Detail.Reseed; got != "host" {
			t.Errorf("restore %d: the agent's reseed was %q, want host", i, got)
		}
		if got := info.Detail.GuestRandom; len(got) != 32 {
			t.Fatalf("restore %d: the agent reported random bytes %q, want 16 bytes of hex", i, got)
		}
	}
	if a, b := infos[0].Detail.GuestRandom, infos[1].Detail.GuestRandom; a == b {
		t.Fatalf("two restores of one snapshot drew the same random bytes %s: they share their RNG state", a)
	}
}

// pcFix is a guest booted and captured on the pc machine, which carries
// the VM Generation ID device.
var (
	pcFix     fixture
	pcFixOnce sync.Once
)

// TestPCRestoresGetNewGenerationIDs restores a snapshot of a pc guest
// twice without the agent's entropy step: the fresh VM Generation ID each
// restore gives the guest is alone in making the two draw different bytes
// (the guest kernel, Linux 6.1, reseeds its RNG on a generation change).
func TestPCRestoresGetNewGenerationIDs(t *testing.T) {
	requireQEMU(t)
	d, err := New(Options{Machine: MachinePC})
	if err != nil {
		t.Fatal(err)
	}
	d.withoutGuestEntropy = true
	pcFixOnce.Do(func() {
		pcFix.err = pcFix.build(d)
		t.Cleanup(func() { os.RemoveAll(pcFix.dir) })
	})
	if pcFix.err != nil {
		t.Fatalf("boot and capture a pc guest: %v", pcFix.err)
	}
	infos := restoreTwice(t, d, &pcFix)
	for i, info := range infos {
		if got := info.Detail.Reseed; got != "none" {
			t.Errorf("restore %d: the agent's reseed was %q, want none (no host entropy sent)", i, got)
		}
	}
	if a, b := infos[0].Detail.GuestRandom, infos[1].Detail.GuestRandom; a == b || len(a) != 32 {
		t.Fatalf("two restores of one pc snapshot drew random bytes %q and %q: the generation ID did not reseed the guest", a, b)
	}
}
