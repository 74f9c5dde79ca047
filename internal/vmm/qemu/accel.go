package qemu

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// kvmProbeTimeout bounds the KVM probe boot. A working KVM reaches the
// probe's kernel panic in about a second; a KVM that cannot run the guest
// either fails at once or hangs, and the hang is cut here.
const kvmProbeTimeout = 30 * time.Second

// probeMemoryMiB is the probe guest's memory: enough for the kernel to
// reach its root mount.
const probeMemoryMiB = 128

// accelProbe caches one probe result per (binary, kernel) for the life of
// the process: the answer depends only on the host.
type accelProbe struct {
	mu    sync.Mutex
	done  bool
	accel string
}

var accelProbes sync.Map // binary + "\x00" + kernel → *accelProbe

// Accel returns the accelerator this driver runs guests with. For
// AccelAuto it probes once per process whether KVM can boot the guest
// kernel and answers AccelKVM if so, AccelTCG otherwise; with
// Options.ProbeCacheDir, once per QEMU binary, kernel and host boot.
//
// The probe is a real boot, not a check that /dev/kvm opens: some hosts
// (PVM, for one) expose a /dev/kvm that runs real-mode code but cannot
// boot an ordinary kernel. The probe boots the kernel with no root file
// system and "panic=-1 reboot=t", so a working KVM panics and resets
// within a second and QEMU, run with -no-reboot, exits 0. Anything else
// (QEMU failing, a hang cut at kvmProbeTimeout) means TCG. Without a
// kernel there is nothing to probe with and the answer is TCG.
func (d *Driver) Accel(ctx context.Context) (string, error) {
	if d.opts.Accel != AccelAuto {
		return d.opts.Accel, nil
	}
	kernel, err := d.Kernel()
	if err != nil {
		return AccelTCG, nil
	}
	v, _ := accelProbes.LoadOrStore(d.opts.Binary+"\x00"+kernel, &accelProbe{})
	p := v.(*accelProbe)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return p.accel, nil
	}
	cache := accelCacheFile(d.opts.ProbeCacheDir, d.opts.Binary, kernel)
	if accel, ok := readAccelCache(cache); ok {
		p.done, p.accel = true, accel
		return accel, nil
	}
	ok := probeKVM(ctx, d.opts.Binary, kernel)
	if err := ctx.Err(); err != nil {
		// An interrupted probe says nothing about the host; do not cache it.
		return "", err
	}
	p.done, p.accel = true, AccelTCG
	if ok {
		p.accel = AccelKVM
	}
	writeAccelCache(cache, p.accel)
	return p.accel, nil
}

// probeKVM reports whether binary boots kernel under KVM far enough to
// panic for want of a root file system and reset.
func probeKVM(ctx context.Context, binary, kernel string) bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return bootsToReset(ctx, binary, AccelKVM, kernel, kvmProbeTimeout)
}

// bootsToReset boots kernel without a root file system under accel and
// reports whether QEMU exits cleanly (the guest panicked and reset) within
// timeout.
func bootsToReset(ctx context.Context, binary, accel, kernel string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	args := append(machineArgs(accel, MachineMicrovm, probeMemoryMiB, 1),
		"-kernel", kernel, "-append", "panic=-1 reboot=t quiet")
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd.Run() == nil && ctx.Err() == nil
}
