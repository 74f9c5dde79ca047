package capture

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"warmstart/internal/layout"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/firecracker"
)

// firecrackerAccel: Firecracker runs guests on KVM and nothing else.
const firecrackerAccel = "kvm"

// Firecracker boots guests with the firecracker driver from a kernel and a
// root file system, waits for the guest agent at the driver's envd address,
// and captures a full snapshot: pause, snapshot create (Full), stop, with
// the memory layout taken from the VM's machine config.
type Firecracker struct {
	// Driver boots and captures the guest; its EnvdAddress is required.
	Driver *firecracker.Driver
	// Spec describes the VM; RuntimeDir is each boot's own and is ignored
	// here. Kernel is required. The snapshot refers to Rootfs by path and
	// every restore of it opens that image, so it should be read-only
	// (RootfsReadOnly) and stay where it is.
	Spec firecracker.BootSpec
}

var _ Booter = (*Firecracker)(nil)

// Prepare checks that the guest's images exist and that the driver can
// tell when its agent is up.
func (f *Firecracker) Prepare(ctx context.Context, progress io.Writer) (GuestInfo, error) {
	if f.Driver == nil {
		return GuestInfo{}, errors.New("firecracker guest: no driver")
	}
	if f.Driver.Options().EnvdAddress == "" {
		return GuestInfo{}, errors.New("firecracker guest: no envd address: a capture waits for the guest agent before it snapshots")
	}
	if f.Spec.Kernel == "" {
		return GuestInfo{}, errors.New("firecracker guest: no kernel")
	}
	for _, img := range []struct{ what, path string }{{"kernel", f.Spec.Kernel}, {"initrd", f.Spec.Initrd}, {"rootfs", f.Spec.Rootfs}} {
		if img.path == "" {
			continue
		}
		if _, err := os.Stat(img.path); err != nil {
			return GuestInfo{}, fmt.Errorf("firecracker guest: %s: %w", img.what, err)
		}
	}
	mib := f.Spec.MemoryMiB
	if mib == 0 {
		mib = firecracker.DefaultMemoryMiB
	}
	return GuestInfo{Accel: firecrackerAccel, MemoryBytes: mib << 20}, nil
}

// Boot starts the VM and waits until its agent answers.
func (f *Firecracker) Boot(ctx context.Context, spec BootSpec) (Guest, vmm.ReadyInfo, error) {
	bs := f.Spec
	bs.RuntimeDir = spec.RuntimeDir
	m, err := f.Driver.Boot(ctx, bs)
	if err != nil {
		return nil, vmm.ReadyInfo{}, err
	}
	ready, err := m.WaitReady(ctx)
	if err != nil {
		// WaitReady's error says how the VM ended if it did; stopping
		// only makes sure it is gone.
		_ = stopFirecracker(ctx, m)
		return nil, vmm.ReadyInfo{}, fmt.Errorf("boot: %w", err)
	}
	return &firecrackerGuest{m: m}, ready, nil
}

type firecrackerGuest struct {
	m *firecracker.Machine
}

// Capture writes a full snapshot and stops the VM.
func (g *firecrackerGuest) Capture(ctx context.Context, vmStatePath, memPath string) (layout.Layout, error) {
	l, err := g.m.Capture(ctx, firecracker.CaptureSpec{VMStatePath: vmStatePath, MemPath: memPath, After: firecracker.StopAfterCapture})
	// A capture refused before it paused the VM leaves it running.
	if _, gone := g.m.Exit(); !gone {
		err = errors.Join(err, stopFirecracker(ctx, g.m))
	}
	if err != nil {
		return layout.Layout{}, err
	}
	return l, nil
}

// stopFirecracker stops m and waits until it is gone, whatever ctx says:
// the stop timeout bounds the wait.
func stopFirecracker(ctx context.Context, m *firecracker.Machine) error {
	if err := m.RequestStop(); err != nil {
		return err
	}
	return m.Wait(context.WithoutCancel(ctx))
}
