package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"warmstart/internal/config"
	"warmstart/internal/vmm/qemu"
)

// replayHint names the VMM every host can run, for errors that say a
// driver cannot run here.
const replayHint = "the replay VMM: --vmm replay --trace FILE (warmstart synth writes a trace)"

// ResolveDriver is the VMM driver [vmm] driver = "auto" means on this
// host: Firecracker where its binary is installed and KVM boots guests,
// else QEMU where its binary is installed. Neither is an error naming
// what is missing and the alternatives. Whether KVM boots guests is the
// QEMU accelerator probe's verdict (cached under [runtime] dir, so only
// the first run on a host boot pays the probe); without QEMU it is
// whether /dev/kvm opens.
func ResolveDriver(ctx context.Context, cfg *config.Config) (string, error) {
	_, fcErr := exec.LookPath(cfg.Firecracker.Binary)
	_, qemuErr := exec.LookPath(cfg.QEMU.Binary)
	if fcErr == nil {
		kvm, err := kvmBootsGuests(ctx, cfg, qemuErr == nil)
		if err != nil {
			return "", err
		}
		if kvm {
			return config.DriverFirecracker, nil
		}
		fcErr = errors.New("KVM cannot boot a guest here")
	}
	if qemuErr == nil {
		return config.DriverQEMU, nil
	}
	return "", fmt.Errorf("[vmm] driver auto: no VMM this host can run: firecracker: %v; qemu: %v; install one ([firecracker] binary, [qemu] binary name them), or use %s", fcErr, qemuErr, replayHint)
}

// kvmBootsGuests reports whether KVM boots a guest on this host.
func kvmBootsGuests(ctx context.Context, cfg *config.Config, haveQEMU bool) (bool, error) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, nil
	}
	f.Close()
	if !haveQEMU {
		return true, nil
	}
	d, err := qemu.New(qemu.Options{Binary: cfg.QEMU.Binary, Accel: qemu.AccelAuto, Kernel: cfg.QEMU.Kernel, ProbeCacheDir: ProbeCacheDir(cfg)})
	if err != nil {
		return false, nil
	}
	accel, err := d.Accel(ctx)
	if err != nil {
		return false, fmt.Errorf("[vmm] driver auto: probe KVM: %w", err)
	}
	return accel == qemu.AccelKVM, nil
}
