package firecracker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"
)

// Boot defaults.
const (
	// DefaultBootArgs gives the guest a serial console, and makes a reboot
	// (what SendCtrlAltDel asks for) go through the keyboard controller,
	// which Firecracker turns into its own exit.
	DefaultBootArgs    = "console=ttyS0 reboot=k panic=1"
	DefaultVCPUs       = 1
	DefaultMemoryMiB   = 128
	DefaultGuestCID    = 3
	rootfsDriveID      = "rootfs"
	minGuestCID        = 3
	maxVCPUs           = 32
	defaultIfacePrefix = "eth"
)

// BootSpec describes a fresh VM.
type BootSpec struct {
	// RuntimeDir is a private directory for the VM's sockets and logs.
	// The caller creates and removes it.
	RuntimeDir string
	Kernel     string
	// Initrd is optional.
	Initrd string
	// BootArgs is the kernel command line; DefaultBootArgs when empty.
	BootArgs string
	// Rootfs is the root block device's image; none when empty.
	Rootfs         string
	RootfsReadOnly bool
	// VCPUs and MemoryMiB default to 1 and 128.
	VCPUs     int
	MemoryMiB int64
	HugePages HugePages
	// TrackDirtyPages enables diff snapshots of this VM.
	TrackDirtyPages bool
	// VsockCID adds a vsock device backed by <RuntimeDir>/vsock.sock. With
	// Options.Vsock the device is always added, with DefaultGuestCID when
	// VsockCID is 0.
	VsockCID uint32
	// NetworkInterfaces are attached in order; an empty IfaceID becomes
	// eth0, eth1, ….
	NetworkInterfaces []NetworkInterface
}

// Boot spawns Firecracker in spec.RuntimeDir, configures the machine, boot
// source, root drive, network interfaces and vsock, and starts the
// instance. On any failure the process is killed and gone before Boot
// returns. WaitReady tells when the guest agent is up.
func (d *Driver) Boot(ctx context.Context, spec BootSpec) (*Machine, error) {
	spec, err := d.bootDefaults(spec)
	if err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	var sockets []string
	var vsock *Vsock
	if spec.VsockCID != 0 {
		vsock = &Vsock{GuestCID: spec.VsockCID, UDSPath: filepath.Join(spec.RuntimeDir, VsockSocketName)}
		sockets = append(sockets, vsock.UDSPath)
	}
	m, err := d.launch(ctx, spec.RuntimeDir, sockets)
	if err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	if err := bootSupported(m.version, spec); err != nil {
		m.abort(KillStartFailed)
		return nil, fmt.Errorf("boot: %w", err)
	}
	type step struct {
		name string
		call func() error
	}
	steps := []step{
		{"machine config", func() error {
			return m.client.PutMachineConfig(ctx, MachineConfig{
				VCPUCount: spec.VCPUs, MemSizeMiB: spec.MemoryMiB,
				HugePages: spec.HugePages, TrackDirtyPages: spec.TrackDirtyPages,
			})
		}},
		{"boot source", func() error {
			return m.client.PutBootSource(ctx, BootSource{KernelImagePath: spec.Kernel, BootArgs: spec.BootArgs, InitrdPath: spec.Initrd})
		}},
	}
	if spec.Rootfs != "" {
		steps = append(steps, step{"root drive", func() error {
			return m.client.PutDrive(ctx, Drive{DriveID: rootfsDriveID, PathOnHost: spec.Rootfs, IsRootDevice: true, IsReadOnly: spec.RootfsReadOnly})
		}})
	}
	for _, iface := range spec.NetworkInterfaces {
		steps = append(steps, step{"network interface " + iface.IfaceID, func() error { return m.client.PutNetworkInterface(ctx, iface) }})
	}
	if vsock != nil {
		steps = append(steps, step{"vsock", func() error { return m.client.PutVsock(ctx, *vsock) }})
	}
	for _, s := range steps {
		if err := s.call(); err != nil {
			return nil, m.failed(ctx, "boot: "+s.name, err)
		}
	}
	m.started = time.Now()
	if err := m.client.Action(ctx, ActionInstanceStart); err != nil {
		return nil, m.failed(ctx, "boot: start instance", err)
	}
	return m, nil
}

// bootSupported refuses what release v cannot configure: it would refuse
// the request body.
func bootSupported(v Version, spec BootSpec) error {
	for _, iface := range spec.NetworkInterfaces {
		if iface.MTU != 0 && !v.AtLeast(mtuSince) {
			return fmt.Errorf("%w: firecracker %s cannot set network interface %s's MTU (mtu needs %s or later)", ErrUnsupportedVersion, v, iface.IfaceID, mtuSince)
		}
	}
	return nil
}

// bootDefaults is spec with the defaults of what it leaves out, or why
// no VM can boot from it.
func (d *Driver) bootDefaults(spec BootSpec) (BootSpec, error) {
	if spec.RuntimeDir == "" {
		return spec, errors.New("runtime directory is empty")
	}
	if spec.Kernel == "" {
		return spec, errors.New("kernel path is empty")
	}
	if spec.BootArgs == "" {
		spec.BootArgs = DefaultBootArgs
	}
	if spec.VCPUs == 0 {
		spec.VCPUs = DefaultVCPUs
	}
	if spec.VCPUs < 1 || spec.VCPUs > maxVCPUs {
		return spec, fmt.Errorf("vcpu count %d is outside [1, %d]", spec.VCPUs, maxVCPUs)
	}
	if spec.MemoryMiB == 0 {
		spec.MemoryMiB = DefaultMemoryMiB
	}
	if spec.MemoryMiB < 0 {
		return spec, fmt.Errorf("memory size %d MiB is negative", spec.MemoryMiB)
	}
	if spec.VsockCID == 0 && d.opts.Vsock {
		spec.VsockCID = DefaultGuestCID
	}
	if spec.VsockCID != 0 && spec.VsockCID < minGuestCID {
		return spec, fmt.Errorf("vsock guest CID %d is below %d", spec.VsockCID, minGuestCID)
	}
	var err error
	spec.NetworkInterfaces, err = interfaceDefaults(spec.NetworkInterfaces)
	return spec, err
}

// interfaceDefaults are the network interfaces with their default ids; an
// interface without a host device is refused.
func interfaceDefaults(in []NetworkInterface) ([]NetworkInterface, error) {
	ifaces := make([]NetworkInterface, len(in))
	for i, iface := range in {
		if iface.HostDevName == "" {
			return in, fmt.Errorf("network interface %d has no host device", i)
		}
		if iface.IfaceID == "" {
			iface.IfaceID = fmt.Sprintf("%s%d", defaultIfacePrefix, i)
		}
		ifaces[i] = iface
	}
	return ifaces, nil
}
