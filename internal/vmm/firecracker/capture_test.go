package firecracker

import (
	"errors"
	"testing"

	"warmstart/internal/layout"
)

func TestMemoryLayout(t *testing.T) {
	const gib = int64(1) << 30
	for _, c := range []struct {
		name     string
		cfg      MachineConfig
		fileSize int64
		arch     string
		want     []layout.Region
	}{
		{"small", MachineConfig{MemSizeMiB: 128}, 128 << 20, "amd64", []layout.Region{{Offset: 0, Size: 128 << 20, PageSize: 4096}}},
		{"exactly 3 GiB", MachineConfig{MemSizeMiB: 3072}, 3 * gib, "amd64", []layout.Region{{Offset: 0, Size: 3 * gib, PageSize: 4096}}},
		{"above the MMIO gap", MachineConfig{MemSizeMiB: 4096}, 4 * gib, "amd64", []layout.Region{
			{Offset: 0, Size: 3 * gib, PageSize: 4096},
			{Offset: 3 * gib, Size: gib, PageSize: 4096},
		}},
		{"aarch64 has no gap", MachineConfig{MemSizeMiB: 4096}, 4 * gib, "arm64", []layout.Region{{Offset: 0, Size: 4 * gib, PageSize: 4096}}},
		{"2M huge pages", MachineConfig{MemSizeMiB: 5120, HugePages: HugePages2M}, 5 * gib, "amd64", []layout.Region{
			{Offset: 0, Size: 3 * gib, PageSize: 2 << 20},
			{Offset: 3 * gib, Size: 2 * gib, PageSize: 2 << 20},
		}},
		{"transparent huge pages map 4 KiB pages", MachineConfig{MemSizeMiB: 256, HugePages: HugePagesTransparent}, 256 << 20, "amd64", []layout.Region{{Offset: 0, Size: 256 << 20, PageSize: 4096}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := memoryLayout(c.cfg, c.fileSize, c.arch)
			if err != nil {
				t.Fatal(err)
			}
			want := layout.Layout{Regions: c.want, FileSize: c.fileSize}
			if !got.Equal(want) {
				t.Fatalf("layout %v (file %d), want %v (file %d)", got, got.FileSize, want, want.FileSize)
			}
		})
	}
	for _, c := range []struct {
		name     string
		cfg      MachineConfig
		fileSize int64
	}{
		{"file shorter", MachineConfig{MemSizeMiB: 128}, 64 << 20},
		{"file longer", MachineConfig{MemSizeMiB: 128}, 129 << 20},
		{"no memory", MachineConfig{}, 0},
		{"huge pages misaligned", MachineConfig{MemSizeMiB: 3, HugePages: HugePages2M}, 3 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := memoryLayout(c.cfg, c.fileSize, "amd64"); !errors.Is(err, ErrLayoutMismatch) {
				t.Fatalf("err %v, want ErrLayoutMismatch", err)
			}
		})
	}
}
