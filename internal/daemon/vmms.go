package daemon

import (
	"fmt"
	"os"
	"strings"

	"warmstart/internal/config"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/firecracker"
	"warmstart/internal/vmm/qemu"
	"warmstart/internal/vmm/replay"
)

// NewVMM returns the driver [vmm] driver names, configured from cfg.
func NewVMM(cfg *config.Config) (vmm.VMM, error) {
	switch cfg.VMM.Driver {
	case config.DriverReplay:
		if _, err := os.Stat(cfg.Replay.Trace); err != nil {
			return nil, fmt.Errorf("replay vmm: [replay] trace: %w", err)
		}
		return &replay.VMM{TracePath: cfg.Replay.Trace}, nil
	case config.DriverFirecracker:
		d, err := firecracker.New(firecracker.Options{
			Binary:       cfg.Firecracker.Binary,
			EnvdAddress:  cfg.Envd.Address,
			PollInterval: cfg.Envd.PollInterval,
			ReadyTimeout: cfg.Envd.Timeout,
			StopTimeout:  cfg.Firecracker.StopTimeout,
			Vsock:        strings.HasPrefix(cfg.Envd.Address, "vsock:"),
		})
		if err != nil {
			return nil, err
		}
		return d, nil
	case config.DriverQEMU:
		d, err := qemu.New(qemu.Options{
			Binary:      cfg.QEMU.Binary,
			Accel:       cfg.QEMU.Accel,
			Kernel:      cfg.QEMU.Kernel,
			MemoryMiB:   int(cfg.QEMU.MemoryMiB),
			VCPUs:       cfg.QEMU.VCPUs,
			StopTimeout: cfg.QEMU.StopTimeout,
		})
		if err != nil {
			return nil, err
		}
		return d, nil
	}
	return nil, fmt.Errorf("[vmm] driver %q: want %s, %s or %s", cfg.VMM.Driver, config.DriverFirecracker, config.DriverQEMU, config.DriverReplay)
}
