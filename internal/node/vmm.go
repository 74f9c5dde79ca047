package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"warmstart/internal/config"
	"warmstart/internal/trace"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/firecracker"
	"warmstart/internal/vmm/qemu"
	"warmstart/internal/vmm/replay"
)

// NewVMM returns the driver [vmm] driver names, configured from cfg. It is
// the one VMM factory of the program.
func NewVMM(ctx context.Context, cfg *config.Config) (vmm.VMM, error) {
	if cfg.VMM.Driver == config.DriverAuto {
		driver, err := ResolveDriver(ctx, cfg)
		if err != nil {
			return nil, err
		}
		c := *cfg
		c.VMM.Driver = driver
		cfg = &c
	}
	switch cfg.VMM.Driver {
	case config.DriverReplay:
		if _, err := os.Stat(cfg.Replay.Trace); err != nil {
			return nil, fmt.Errorf("replay vmm: [replay] trace: %w", err)
		}
		return &replay.VMM{TracePath: cfg.Replay.Trace, ReadyTimeout: cfg.Agent.Timeout}, nil
	case config.DriverFirecracker:
		d, err := firecracker.New(firecracker.Options{
			Binary:          cfg.Firecracker.Binary,
			EnvdAddress:     cfg.Agent.Address,
			PollInterval:    cfg.Agent.PollInterval,
			ReadyTimeout:    cfg.Agent.Timeout,
			StopTimeout:     cfg.Firecracker.StopTimeout,
			LoadTimeout:     cfg.Firecracker.LoadTimeout,
			TrackDirtyPages: cfg.Firecracker.TrackDirtyPages,
			Vsock:           strings.HasPrefix(cfg.Agent.Address, "vsock:"),
			Uffd:            cfg.Memory.Device == config.DeviceUffd,
		})
		if err != nil {
			return nil, err
		}
		return d, nil
	case config.DriverQEMU:
		return NewQEMU(ctx, cfg)
	}
	return nil, fmt.Errorf("[vmm] driver %q: want %s, %s or %s", cfg.VMM.Driver, config.DriverFirecracker, config.DriverQEMU, config.DriverReplay)
}

// CheckDriverBackend asks the driver named driver (resolved: not auto)
// whether it restores with memory backend b, without building it: the
// CLI asks before it opens anything. vmm.CheckBackend asks a built one.
func CheckDriverBackend(driver string, b vmm.Backend) error {
	if driver == config.DriverQEMU {
		return qemu.CheckBackend(b)
	}
	return nil
}

// NewQEMU builds the qemu driver from [qemu] with its accelerator
// resolved: "auto" probes the host here, once, rather than inside the
// first timed restore. A snapshot restores only under the accelerator,
// machine type, memory size and vCPU count it was captured with.
func NewQEMU(ctx context.Context, cfg *config.Config) (*qemu.Driver, error) {
	d, err := qemu.New(qemu.Options{
		Binary:        cfg.QEMU.Binary,
		Accel:         cfg.QEMU.Accel,
		Machine:       cfg.QEMU.Machine,
		Kernel:        cfg.QEMU.Kernel,
		MemoryMiB:     int(cfg.QEMU.MemoryMiB),
		VCPUs:         cfg.QEMU.VCPUs,
		StopTimeout:   cfg.QEMU.StopTimeout,
		AgentWorkload: cfg.QEMU.AgentWorkload,
		ProbeCacheDir: ProbeCacheDir(cfg),
	})
	if err != nil {
		return nil, err
	}
	accel, err := d.Accel(ctx)
	if err != nil {
		return nil, fmt.Errorf("qemu driver: %w", err)
	}
	opts := d.Options()
	opts.Accel = accel
	return qemu.New(opts)
}

// ProbeCacheDir is where the QEMU accelerator probe keeps its verdict
// between runs: under [runtime] dir, beside the other run-time files.
func ProbeCacheDir(cfg *config.Config) string { return filepath.Join(cfg.Runtime.Dir, "probe") }

// InitramfsCache is where built guest initramfs images are kept between
// runs.
func InitramfsCache(cfg *config.Config) string { return filepath.Join(cfg.Runtime.Dir, "initramfs") }

// FlagError marks an error in how a verb's --vmm or --trace was given,
// which the CLI reports as a usage error (exit 2); a trace file that
// cannot be read or a configuration the driver cannot use is no FlagError.
type FlagError struct{ Err error }

func (e *FlagError) Error() string { return e.Err.Error() }
func (e *FlagError) Unwrap() error { return e.Err }

// CheckReplayTrace refuses a trace the replay VMM could not play (--trace,
// [replay] trace), before a device is mounted or a VMM started: the VMM's
// own complaint would end in a log inside a runtime directory the verb
// removes on its way out. trace.ReadFile opens it without blocking, so a
// FIFO or a device at path is refused at once instead of hanging the
// verb in open(2). The error does not name path; the caller says where
// path came from.
func CheckReplayTrace(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return errors.New("is a directory, want a startup trace file (warmstart synth writes one)")
	}
	if _, err := trace.ReadFile(path); err != nil {
		return fmt.Errorf("not a startup trace: %w", err)
	}
	return nil
}

// WithVMM is cfg with [vmm] driver and [replay] trace taken from a verb's
// --vmm and --trace, checked here so that a bad flag is named as one.
func WithVMM(cfg *config.Config, driver, trace string) (*config.Config, error) {
	c := *cfg
	c.VMM.Driver, c.Replay.Trace = driver, trace
	switch driver {
	case config.DriverReplay:
		if trace == "" {
			return nil, &FlagError{fmt.Errorf("--vmm replay needs --trace FILE (warmstart synth writes one)")}
		}
		// Whatever is wrong with the file --trace names (absent, no
		// regular file, no trace), the flag named it: a usage error.
		if err := CheckReplayTrace(trace); err != nil {
			return nil, &FlagError{fmt.Errorf("--trace %s: %w", trace, err)}
		}
	case config.DriverQEMU:
		if _, err := exec.LookPath(cfg.QEMU.Binary); err != nil {
			return nil, fmt.Errorf("--vmm qemu: no QEMU binary %q on this host ([qemu] binary; apt-get install qemu-system-x86); %s", cfg.QEMU.Binary, replayHint)
		}
	case config.DriverFirecracker:
		if _, err := exec.LookPath(cfg.Firecracker.Binary); err != nil {
			return nil, fmt.Errorf("--vmm firecracker: no Firecracker binary %q on this host ([firecracker] binary); use --vmm qemu for a real guest under QEMU, or %s", cfg.Firecracker.Binary, replayHint)
		}
		// Ready is the guest agent answering: refused here rather than
		// after the first VM has started.
		if cfg.Agent.Address == "" {
			return nil, fmt.Errorf("--vmm firecracker: [agent] address is empty; set it to the guest agent's health endpoint (vsock:PORT, unix:PATH or http://HOST:PORT/health), or use --vmm qemu, whose guest agent needs no address")
		}
	case config.DriverAuto:
		return nil, fmt.Errorf("--vmm auto: resolve it first (ResolveDriver)")
	default:
		return nil, &FlagError{fmt.Errorf("--vmm %q: want auto, replay, qemu or firecracker", driver)}
	}
	return &c, nil
}
