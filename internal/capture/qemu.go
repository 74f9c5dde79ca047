package capture

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"warmstart/internal/initramfs"
	"warmstart/internal/layout"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/qemu"
)

// QEMU boots warmstart's real test guest with the qemu driver: a microvm
// whose /init is the warmstart-agent and whose RAM is a shared mapping of
// the memory file from boot, so that capturing it only writes the device
// state. It is safe for concurrent use.
type QEMU struct {
	// Driver boots and captures the guest. Required.
	Driver *qemu.Driver
	// Initrd is the agent's initramfs. When empty it is built with
	// Initramfs (whose CacheDir is then required), once.
	Initrd    string
	Initramfs initramfs.Options

	mu     sync.Mutex
	initrd string // what Prepare settled on
}

var _ Booter = (*QEMU)(nil)

// Prepare builds the agent's initramfs unless Initrd names one, and
// resolves the accelerator.
func (q *QEMU) Prepare(ctx context.Context, progress io.Writer) (GuestInfo, error) {
	if q.Driver == nil {
		return GuestInfo{}, errors.New("qemu guest: no driver")
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.initrd == "" {
		initrd := q.Initrd
		if initrd == "" {
			fmt.Fprintln(progress, "building the agent's initramfs")
			var err error
			if initrd, err = initramfs.Build(ctx, q.Initramfs); err != nil {
				return GuestInfo{}, err
			}
		} else if _, err := os.Stat(initrd); err != nil {
			return GuestInfo{}, fmt.Errorf("qemu guest: initrd: %w", err)
		}
		q.initrd = initrd
	}
	accel, err := q.Driver.Accel(ctx)
	if err != nil {
		return GuestInfo{}, err
	}
	return GuestInfo{Accel: accel, MemoryBytes: q.Driver.MemoryBytes()}, nil
}

// Boot starts the guest with its RAM in spec.MemPath and waits for the
// agent, whose token is in the ready detail.
func (q *QEMU) Boot(ctx context.Context, spec BootSpec) (Guest, vmm.ReadyInfo, error) {
	q.mu.Lock()
	initrd := q.initrd
	q.mu.Unlock()
	if initrd == "" {
		return nil, vmm.ReadyInfo{}, errors.New("qemu guest: boot before prepare")
	}
	m, err := q.Driver.Boot(ctx, qemu.BootSpec{MemPath: spec.MemPath, Initrd: initrd, RuntimeDir: spec.RuntimeDir})
	if err != nil {
		return nil, vmm.ReadyInfo{}, err
	}
	return &qemuGuest{m: m, memPath: spec.MemPath, layout: q.Driver.Layout()}, m.Ready(), nil
}

type qemuGuest struct {
	m       *qemu.Machine
	memPath string
	layout  layout.Layout
}

var _ Checkpointer = (*qemuGuest)(nil)

// Checkpoint writes the device state and a copy of the guest's memory
// file, and lets the guest run on.
func (g *qemuGuest) Checkpoint(ctx context.Context, vmStatePath, memPath string) (layout.Layout, error) {
	if err := g.m.Checkpoint(ctx, vmStatePath, memPath); err != nil {
		return layout.Layout{}, err
	}
	return g.layout, nil
}

// Ping has the agent answer one more ping.
func (g *qemuGuest) Ping(ctx context.Context) (vmm.ReadyInfo, error) { return g.m.WaitReady(ctx) }

// Stop stops the guest and waits for QEMU to exit.
func (g *qemuGuest) Stop(ctx context.Context) error {
	return errors.Join(g.m.RequestStop(), g.m.Wait(ctx))
}

// Capture writes the device state; the memory is already in the file the
// guest booted with, laid out as the driver maps it. QEMU quits after a
// capture, and is killed by a failed one.
func (g *qemuGuest) Capture(ctx context.Context, vmStatePath, memPath string) (layout.Layout, error) {
	if memPath != g.memPath {
		err := fmt.Errorf("qemu guest: capture into %s, but the guest's memory is %s", memPath, g.memPath)
		if serr := g.m.RequestStop(); serr != nil {
			err = errors.Join(err, serr)
		}
		return layout.Layout{}, errors.Join(err, g.m.Wait(context.WithoutCancel(ctx)))
	}
	if err := g.m.Capture(ctx, vmStatePath); err != nil {
		return layout.Layout{}, err
	}
	return g.layout, nil
}
