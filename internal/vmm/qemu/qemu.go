// Package qemu drives QEMU's microvm machine (or, for a VM Generation ID,
// its pc machine) as warmstart's real guest on hosts where Firecracker
// cannot run (no usable KVM). It boots a Linux
// kernel with the warmstart-agent initramfs, captures the running guest and
// restores it with the same memory semantics as Firecracker's File backend:
//
//   - Boot maps guest RAM from a memory file with share=on (MAP_SHARED), so
//     the guest's memory is that file.
//   - Capture sets the x-ignore-shared migration capability, pauses the
//     guest and migrates it to a small device-state file; shared RAM is not
//     copied, it stays in the memory file.
//   - Restore maps a memory file with share=off (MAP_PRIVATE): pages are
//     read from the file on first touch and guest writes stay private, so
//     the file is never modified. It then loads the device state with a
//     deferred incoming migration and continues the guest.
//
// Readiness is the agent answering a ping on the serial console sent after
// the guest was continued; its answer carries a token drawn at first boot,
// which proves the restored guest resumed the captured state, and a digest
// of the agent's heap and data files, sampled after it walked them on
// resume, which must equal the captured guest's.
//
// What the agent builds at boot and walks at each resume is
// Options.AgentWorkload, passed on the guest kernel's command line at boot
// (see internal/agentspec); a snapshot keeps the workload it was captured
// with. A ready Machine also implements vmm.StateAgent: the agent writes
// named state buffers into guest memory and reads them back on request,
// so a test can tell what a guest held when it was snapshotted.
//
// Every restore is a machine of its own: restores of one snapshot start
// with the same guest RNG state, so each ping carries fresh host entropy,
// which the agent mixes into the guest kernel's RNG and reseeds it from
// before its first answer after a resume, and on the pc machine each
// restore gets a fresh VM Generation ID (vmgen.go).
//
// A restore needs only the device state and the memory file: the kernel
// and initramfs are not passed, as on Firecracker. Capture and restore must
// use the same accelerator, machine type, CPU model, memory size and vCPU
// count; callers should record Driver.Accel with each snapshot. Under TCG the guest's
// clock counts instructions (TCGICount), which keeps its boot independent
// of host load.
//
// QEMU opens the memory file O_RDWR even with share=off (it never writes
// it), so a memory device serving the file must accept read-write opens.
//
// QMP goes through github.com/digitalocean/go-qemu/qmp. Its SocketMonitor
// takes no context, so every command runs under a watchdog that closes the
// monitor when the context ends (see monitor.go). Migration and run state
// are polled with query-migrate and query-status rather than waited for as
// events, because the SocketMonitor blocks its reader if an event
// subscriber falls behind.
//
// QEMU advises guest RAM MADV_HUGEPAGE, which on a file mapping makes the
// kernel read 2 MiB-aligned blocks around every fault. Firecracker's File
// backend does not, so by default QEMU is started through a launcher (this
// executable re-executed with WARMSTART_ROLE=qemu-launcher) that installs a
// seccomp filter failing that advice and then execs QEMU in place; see
// launcher.go and Options.KeepHugePageAdvice.
//
// No QEMU process outlives its Machine: every error path kills it, Wait
// kills it after StopTimeout, and the child carries PR_SET_PDEATHSIG
// (SIGKILL) so it dies with the process that started it (the launcher
// execs QEMU in its own process, which keeps the setting).
package qemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"time"

	"warmstart/internal/agentspec"
	"warmstart/internal/layout"
	"warmstart/internal/vmm"
)

// Accelerators for Options.Accel.
const (
	// AccelAuto uses KVM when it can boot a normal guest and TCG otherwise.
	AccelAuto = "auto"
	// AccelKVM uses hardware virtualisation.
	AccelKVM = "kvm"
	// AccelTCG uses QEMU's software emulation.
	AccelTCG = "tcg"
)

// Machine types for Options.Machine.
const (
	// MachineMicrovm is QEMU's microvm, the machine closest to
	// Firecracker's: no PCI, no firmware beyond what Linux needs. Its ACPI
	// tables carry no VM Generation ID device, so a restored guest learns
	// that it is a new machine only from the agent's entropy step (see
	// Machine.WaitReady).
	MachineMicrovm = "microvm"
	// MachinePC is the i440FX PC. It boots through SeaBIOS, a few seconds
	// slower under TCG, and carries QEMU's vmgenid device: each restore
	// gives the guest a fresh VM Generation ID, on which Linux 5.18 and
	// later reseed their RNG.
	MachinePC = "pc"
)

// Defaults applied by New to zero fields of Options.
const (
	DefaultBinary      = "qemu-system-x86_64"
	DefaultMachine     = MachineMicrovm
	DefaultMemoryMiB   = 128
	DefaultVCPUs       = 1
	DefaultStopTimeout = 5 * time.Second
)

// KernelGlob is where New looks for a guest kernel when Options.Kernel is empty.
const KernelGlob = "/boot/vmlinuz-*"

var (
	// ErrUnsupportedBackend is returned by Restore for a memory backend
	// other than File: QEMU cannot hand its guest memory to a userfaultfd
	// page-fault handler the way Firecracker's Uffd backend does.
	ErrUnsupportedBackend = errors.New("memory backend not supported by the QEMU driver")
	// ErrNoKernel is returned when no guest kernel is configured or found.
	ErrNoKernel = errors.New("no guest kernel")
	// ErrExited is wrapped when QEMU exited while the driver waited for it.
	ErrExited = errors.New("qemu exited")
	// ErrKilled is returned by Wait when QEMU had to be killed because it
	// did not exit within StopTimeout or before the context ended. The
	// process is gone either way.
	ErrKilled = errors.New("qemu killed")
	// ErrNotCapturable is returned by Capture on a restored machine: its
	// memory is private, so a capture would not land in a memory file.
	ErrNotCapturable = errors.New("machine was restored with private memory and cannot be captured")
)

// Options configures the driver. Zero fields take the defaults above.
type Options struct {
	// Binary is the QEMU system emulator, a path or a name on PATH.
	Binary string `json:"binary"`
	// Accel is AccelAuto, AccelKVM or AccelTCG.
	Accel string `json:"accel"`
	// Machine is MachineMicrovm or MachinePC. A snapshot restores only on
	// the machine type it was captured on.
	Machine string `json:"machine"`
	// Kernel is the guest kernel for Boot. Empty means the newest
	// KernelGlob by version. Restore does not use it.
	Kernel string `json:"kernel"`
	// MemoryMiB is the guest's memory size, which is also the size of the
	// memory file. The JSON has it in bytes (memory_bytes), as every size
	// in warmstart's JSON (docs/json.md).
	MemoryMiB int `json:"-"`
	// VCPUs is the number of virtual CPUs.
	VCPUs int `json:"vcpus"`
	// StopTimeout is how long Wait lets QEMU exit before killing it.
	StopTimeout time.Duration `json:"stop_timeout_ns"`
	// KeepHugePageAdvice lets QEMU advise guest RAM MADV_HUGEPAGE. Off, the
	// default, QEMU starts through a launcher that makes that advice fail
	// (see launcher.go): with it, the kernel reads 2-4 MiB around every
	// fault on the memory file whatever the device's readahead, where
	// Firecracker's File backend faults page by page. Turning it on gives
	// back huge pages for QEMU's own buffers at the cost of that fidelity.
	KeepHugePageAdvice bool `json:"keep_huge_page_advice"`
	// AgentWorkload is the resume workload a booted guest's agent builds
	// and walks, as agentspec.ParseWorkload reads it
	// ("heap_mib=40,pool_mib=24,pool_fraction=0.33"); empty is the light
	// start-up. Boot passes it on the guest kernel's command line, so it
	// is part of what a capture snapshots; Restore does not use it.
	AgentWorkload string `json:"agent_workload,omitempty"`
	// ProbeCacheDir, when set, keeps AccelAuto's verdict across processes
	// (see accelcache.go), so a verb does not pay a probe boot each run.
	ProbeCacheDir string `json:"probe_cache_dir,omitempty"`
}

type plainOptions Options

// MarshalJSON writes the options with the memory size in bytes.
func (o Options) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		plainOptions
		MemoryBytes int64 `json:"memory_bytes"`
	}{plainOptions(o), int64(o.MemoryMiB) << 20})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (o *Options) UnmarshalJSON(data []byte) error {
	var j struct {
		plainOptions
		MemoryBytes int64 `json:"memory_bytes"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*o = Options(j.plainOptions)
	o.MemoryMiB = int(j.MemoryBytes >> 20)
	return nil
}

// Driver boots, captures and restores QEMU guests. It is safe for
// concurrent use; each Machine needs its own runtime directory.
type Driver struct {
	opts Options
	// workload is opts.AgentWorkload, parsed.
	workload agentspec.Workload
	// withoutGuestEntropy leaves the host's entropy out of the agent's
	// pings, so a test sees the generation ID change alone at work.
	withoutGuestEntropy bool
}

var _ vmm.VMM = (*Driver)(nil)

// New checks opts, fills defaults and finds the QEMU binary.
func New(opts Options) (*Driver, error) {
	if opts.Binary == "" {
		opts.Binary = DefaultBinary
	}
	bin, err := exec.LookPath(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("qemu driver: find %s: %w", opts.Binary, err)
	}
	opts.Binary = bin
	switch opts.Accel {
	case "":
		opts.Accel = AccelAuto
	case AccelAuto, AccelKVM, AccelTCG:
	default:
		return nil, fmt.Errorf("qemu driver: accel %q is not %q, %q or %q", opts.Accel, AccelAuto, AccelKVM, AccelTCG)
	}
	switch opts.Machine {
	case "":
		opts.Machine = DefaultMachine
	case MachineMicrovm, MachinePC:
	default:
		return nil, fmt.Errorf("qemu driver: machine %q is not %q or %q", opts.Machine, MachineMicrovm, MachinePC)
	}
	if opts.MemoryMiB == 0 {
		opts.MemoryMiB = DefaultMemoryMiB
	}
	if opts.MemoryMiB < 16 {
		return nil, fmt.Errorf("qemu driver: memory %d MiB is too small for a Linux guest", opts.MemoryMiB)
	}
	if opts.VCPUs == 0 {
		opts.VCPUs = DefaultVCPUs
	}
	if opts.VCPUs < 0 {
		return nil, fmt.Errorf("qemu driver: %d vCPUs", opts.VCPUs)
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	if opts.StopTimeout < 0 {
		return nil, fmt.Errorf("qemu driver: negative stop timeout %v", opts.StopTimeout)
	}
	w, err := agentWorkload(opts)
	if err != nil {
		return nil, fmt.Errorf("qemu driver: agent workload: %w", err)
	}
	return &Driver{opts: opts, workload: w}, nil
}

// agentWorkload parses opts.AgentWorkload and checks that it fits the guest.
func agentWorkload(opts Options) (agentspec.Workload, error) {
	w, err := agentspec.ParseWorkload(opts.AgentWorkload)
	if err != nil {
		return agentspec.Workload{}, err
	}
	return w, w.Fits(opts.MemoryMiB)
}

// Options returns the driver's options with defaults filled in.
func (d *Driver) Options() Options { return d.opts }

// MemoryBytes is the size of the guest's memory and of its memory file.
func (d *Driver) MemoryBytes() int64 { return int64(d.opts.MemoryMiB) << 20 }

// Layout is the memory layout of the memory file this driver writes and
// maps: one region covering the whole file.
func (d *Driver) Layout() layout.Layout { return layout.Single(d.MemoryBytes()) }
