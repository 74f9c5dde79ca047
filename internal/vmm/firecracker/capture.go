package firecracker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"

	"warmstart/internal/layout"
)

const (
	mibBytes = 1 << 20
	// x86LowMemoryEndBytes is where Firecracker's x86_64 guest RAM below
	// 4 GiB ends: the 32-bit MMIO gap (MMIO32_MEM_START) starts at 3 GiB,
	// and RAM past it continues at 4 GiB as a second region. Releases
	// before the PCI layout put the gap at 3.25 GiB; their memory files are
	// still contiguous, so a layout derived here covers the same bytes
	// and only the boundary between the two regions differs.
	x86LowMemoryEndBytes = 3 << 30
	hugePage2MBytes      = 2 << 20
)

// ErrLayoutMismatch: the memory file Firecracker wrote does not have the
// size its machine config implies.
var ErrLayoutMismatch = errors.New("memory file does not match the machine config")

// AfterCapture says what happens to the VM once its snapshot is written.
type AfterCapture int

const (
	// ResumeAfterCapture resumes the VM.
	ResumeAfterCapture AfterCapture = iota
	// StopAfterCapture kills the VM and waits for it: its state is in the
	// snapshot, and a paused guest could not act on SendCtrlAltDel anyway.
	StopAfterCapture
)

// CaptureSpec says where a snapshot goes.
type CaptureSpec struct {
	VMStatePath string
	MemPath     string
	After       AfterCapture
	// Type is SnapshotFull when empty. SnapshotDiff writes only the pages
	// dirtied since the VM was booted or restored, or since its last
	// snapshot, into a memory file of the full size: the VM must track
	// dirty pages (BootSpec.TrackDirtyPages, Options.TrackDirtyPages).
	Type SnapshotType
}

// Capture pauses the VM, writes a snapshot (PUT /snapshot/create, Full
// unless spec.Type says otherwise) and returns the memory file's layout
// taken from GET /machine-config, then resumes or stops the VM. The files are left as
// Firecracker wrote them; making them durable is the repository's job when
// it takes them in (BeginCapture/Publish).
func (m *Machine) Capture(ctx context.Context, spec CaptureSpec) (layout.Layout, error) {
	if spec.VMStatePath == "" || spec.MemPath == "" {
		return layout.Layout{}, errors.New("capture: vm state and memory paths must both be set")
	}
	if spec.Type != "" && spec.Type != SnapshotFull && spec.Type != SnapshotDiff {
		return layout.Layout{}, fmt.Errorf("capture: snapshot type %q is neither %s nor %s", spec.Type, SnapshotFull, SnapshotDiff)
	}
	if err := m.client.SetVMState(ctx, VMPaused); err != nil {
		return layout.Layout{}, fmt.Errorf("capture: pause: %w", err)
	}
	l, err := m.snapshot(ctx, spec)
	switch spec.After {
	case StopAfterCapture:
		if serr := m.stopNow(ctx, KillCaptured); serr != nil {
			err = errors.Join(err, fmt.Errorf("capture: stop: %w", serr))
		}
	default:
		// Resume even when the capture failed or ctx ended: a VM left
		// paused is a hung sandbox.
		if rerr := m.Resume(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("capture: resume: %w", rerr))
		}
	}
	if err != nil {
		return layout.Layout{}, err
	}
	return l, nil
}

func (m *Machine) snapshot(ctx context.Context, spec CaptureSpec) (layout.Layout, error) {
	typ := spec.Type
	if typ == "" {
		typ = SnapshotFull
	}
	err := m.client.CreateSnapshot(ctx, SnapshotCreate{
		SnapshotType: typ,
		SnapshotPath: spec.VMStatePath,
		MemFilePath:  spec.MemPath,
	})
	if err != nil {
		return layout.Layout{}, fmt.Errorf("capture: create snapshot: %w", err)
	}
	cfg, err := m.client.MachineConfig(ctx)
	if err != nil {
		return layout.Layout{}, fmt.Errorf("capture: %w", err)
	}
	st, err := os.Stat(spec.MemPath)
	if err != nil {
		return layout.Layout{}, fmt.Errorf("capture: %w", err)
	}
	l, err := MemoryLayout(cfg, st.Size())
	if err != nil {
		return layout.Layout{}, fmt.Errorf("capture: %s: %w", spec.MemPath, err)
	}
	return l, nil
}

// MemoryLayout is the layout of the memory file of a full snapshot of a VM
// with machine config cfg on this host's architecture. Firecracker writes
// the guest's RAM regions back to back, so file offsets are contiguous
// even where guest addresses are not: on x86_64 a guest above 3 GiB has
// two regions, [0, 3 GiB) and [3 GiB, size) in the file, mapped at guest
// addresses 0 and 4 GiB. On aarch64 RAM is one region for any size.
func MemoryLayout(cfg MachineConfig, memFileBytes int64) (layout.Layout, error) {
	return memoryLayout(cfg, memFileBytes, runtime.GOARCH)
}

func memoryLayout(cfg MachineConfig, memFileBytes int64, arch string) (layout.Layout, error) {
	if cfg.MemSizeMiB <= 0 || cfg.MemSizeMiB > (1<<62)/mibBytes {
		return layout.Layout{}, fmt.Errorf("%w: mem_size_mib %d", ErrLayoutMismatch, cfg.MemSizeMiB)
	}
	memBytes := cfg.MemSizeMiB * mibBytes
	if memFileBytes != memBytes {
		// Anything else (hotplugged memory, a diff snapshot) has regions
		// this derivation cannot know.
		return layout.Layout{}, fmt.Errorf("%w: file is %d bytes, mem_size_mib %d is %d bytes", ErrLayoutMismatch, memFileBytes, cfg.MemSizeMiB, memBytes)
	}
	pageSize := int64(layout.DefaultPageSize)
	if cfg.HugePages == HugePages2M {
		pageSize = hugePage2MBytes
	}
	l := layout.Layout{FileSize: memBytes}
	if arch == "amd64" && memBytes > x86LowMemoryEndBytes {
		l.Regions = []layout.Region{
			{Offset: 0, Size: x86LowMemoryEndBytes, PageSize: pageSize},
			{Offset: x86LowMemoryEndBytes, Size: memBytes - x86LowMemoryEndBytes, PageSize: pageSize},
		}
	} else {
		l.Regions = []layout.Region{{Offset: 0, Size: memBytes, PageSize: pageSize}}
	}
	if err := l.Validate(); err != nil {
		return layout.Layout{}, fmt.Errorf("%w: %w", ErrLayoutMismatch, err)
	}
	return l, nil
}
