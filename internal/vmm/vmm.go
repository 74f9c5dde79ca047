// Package vmm defines what warmstart needs from a virtual machine monitor to
// restore a snapshot and learn when its guest is ready. Drivers live in
// subpackages: firecracker (production), qemu (a real guest on hosts without
// a usable KVM) and replay (a stand-in process that touches memory exactly
// as Firecracker maps it, for fast deterministic tests and benchmarks).
package vmm

import (
	"context"
	"errors"
	"time"

	"warmstart/internal/layout"
)

// Backend names how the VMM obtains guest memory, as Firecracker's
// mem_backend.backend_type does.
type Backend string

const (
	// BackendFile: the VMM maps MemPath MAP_PRIVATE.
	BackendFile Backend = "File"
	// BackendUffd: the VMM connects to the Unix socket at MemPath and hands
	// its userfaultfd to the page-fault handler listening there. It may do
	// so, and fault guest memory through the handler, before Restore
	// returns (Firecracker does, inside its snapshot load), so the handler
	// serves from before Restore is called.
	BackendUffd Backend = "Uffd"
)

// RestoreSpec is everything a driver needs to restore one snapshot.
type RestoreSpec struct {
	SnapshotID  string
	VMStatePath string
	Backend     Backend
	MemPath     string
	Layout      layout.Layout
	// RuntimeDir is a private directory for this instance's sockets and logs.
	// The caller creates and removes it.
	RuntimeDir string
	// Paused asks the driver to load the snapshot without running the
	// guest (Firecracker's resume_vm = false); the instance then implements
	// Resumer. Prefetch policies that must finish before the guest runs use it.
	Paused bool
	// HandlerDone, for the Uffd backend, closes when the page-fault handler
	// stops serving, or refuses the VMM. A guest whose handler is gone
	// hangs on its next fault, so a driver that sees it close before the
	// instance is stopped kills the VM rather than leave it hanging, and
	// one that sees it close inside Restore fails the Restore.
	HandlerDone <-chan struct{}
	// Pausable: the VM will be asked to pause and save a diff (Pauser).
	// A driver that cannot needs nothing else; one that keeps guest
	// memory shared to do it (WritableMemory) maps MemPath shared.
	Pausable bool
}

// Pauser is a restored VM that can be paused and saved as a diff of what
// it was restored from (RestoreSpec.Pausable).
type Pauser interface {
	Resumer
	// Pause stops the guest's vCPUs; Resume lets them run again.
	Pause(ctx context.Context) error
	// SaveDiff writes the device state to spec.Dir/vm_state.bin and, unless
	// the memory device keeps them (Diff.DeviceTracked), the pages the guest
	// changed since its restore or the last SaveDiff to spec.Dir/memory.diff
	// (sparse: its data extents are the changed pages). The VM must be
	// paused.
	SaveDiff(ctx context.Context, spec DiffSpec) (Diff, error)
}

// DiffSpec is where a SaveDiff writes.
type DiffSpec struct{ Dir string }

// Diff is what a SaveDiff wrote.
type Diff struct {
	// VMStatePath is the saved device state.
	VMStatePath string
	// DeviceTracked: the changed pages were written to guest memory's
	// device (memdev.WriteTracker), not to a diff file.
	DeviceTracked bool
	// MemoryDiffPath is the sparse file of changed pages when not
	// DeviceTracked.
	MemoryDiffPath string
}

// WritableMemory is a driver whose pausable restores write guest memory
// back to its file (QEMU maps it shared), so the memory device must take
// writes.
type WritableMemory interface{ WritableMemory() bool }

// Names of the files a SaveDiff writes in DiffSpec.Dir.
const (
	DiffVMStateFile = "vm_state.bin"
	DiffMemoryFile  = "memory.diff"
)

// Resumer is implemented by instances restored with RestoreSpec.Paused.
type Resumer interface {
	// Resume lets the guest run.
	Resume() error
}

// StateAgent is implemented by instances whose guest agent keeps named
// state a caller can change and read back (the QEMU test guest's agent
// does): the proof that a snapshot of a running guest kept what the guest
// wrote before it. Call it once the instance is ready.
type StateAgent interface {
	// WriteState has the agent make key a buffer of kib KiB filled with a
	// deterministic pattern from seed, every page written and held for
	// the life of the guest, and returns its digest as the agent read it
	// back.
	WriteState(ctx context.Context, key string, kib int64, seed uint64) (digest string, err error)
	// State returns every buffer's digest by key, each read again from
	// guest memory, so a buffer that lost a page reports another digest.
	State(ctx context.Context) (map[string]string, error)
}

var (
	// ErrStateRefused is wrapped by a StateAgent's errors when the agent
	// refused the request (a malformed key, a size over its cap, too
	// little guest memory); the error says why.
	ErrStateRefused = errors.New("guest agent refused the state request")
	// ErrNoStateAgent is wrapped when the guest's agent does not know
	// state requests: it was captured with an agent older than them.
	ErrNoStateAgent = errors.New("guest agent keeps no state")
)

// Process is implemented by instances that run as one host process: the
// process that maps guest memory. A restore on the file device reads that
// process's page tables at ready to learn which prefetched pages the guest
// used (package residency); the device itself cannot see those touches.
type Process interface {
	PID() int
}

// Exiter is implemented by instances whose driver reaps the VMM process.
// A restore on the Uffd backend waits for the VMM to connect to the
// page-fault handler; when Restore returned before the VMM connected,
// Exited lets it stop waiting as soon as the VMM is gone, since a dead VMM
// never connects. (A VMM that dies inside Restore fails the Restore.)
type Exiter interface {
	// Exited is closed once the VMM process has exited and been reaped.
	Exited() <-chan struct{}
	// ExitStatus says how the process ended: its exit status or signal,
	// and what else the driver knows (why it killed it, its last output).
	// Call it after Exited has closed.
	ExitStatus() string
}

// ReadyInfo is what a driver learned by the time the guest was ready.
type ReadyInfo struct {
	// Started is when the VMM began loading the snapshot.
	Started time.Time
	// Ready is when the guest agent answered.
	Ready time.Time
	// Detail carries driver-specific facts: the replay VMM's hash over the
	// bytes it read, a real guest's token.
	Detail ReadyDetail
}

// ReadyDetail is what a driver reports at ready, typed: the daemon's API
// and every verb's --json print it as it is (docs/json.md). A fact a
// driver does not report is left zero and absent from the JSON.
type ReadyDetail struct {
	// PID is the VMM process's id.
	PID int `json:"pid"`
	// Token is the guest agent's token (QEMU's agent), drawn at boot.
	Token string `json:"token,omitempty"`
	// Uptime is the guest's uptime when its agent answered.
	Uptime time.Duration `json:"uptime_ns,omitzero"`
	// Digest is the agent's digest over its workload's memory.
	Digest string `json:"digest,omitempty"`
	// GuestRandom is hex of bytes the agent drew from the guest's RNG after
	// reseeding it; Reseed says how reseeding went ("host", "none", ...).
	GuestRandom string `json:"guest_random,omitempty"`
	Reseed      string `json:"reseed,omitempty"`
	// APISocket, AgentAnswer and FirecrackerVersion are Firecracker's.
	APISocket          string `json:"api_socket,omitempty"`
	AgentAnswer        string `json:"agent_answer,omitempty"`
	FirecrackerVersion string `json:"firecracker_version,omitempty"`
	// SHA256 is the replay VMM's hash over the bytes it read; TouchedPages
	// the distinct trace pages it touched, RemovedPages those touched again
	// after removal; FirstTouch when it first touched memory.
	SHA256       string    `json:"sha256,omitempty"`
	TouchedPages int       `json:"touched_pages,omitzero"`
	RemovedPages int       `json:"removed_pages,omitzero"`
	FirstTouch   time.Time `json:"first_touch_at,omitzero"`
}

// VM is one restored VM.
type VM interface {
	// WaitReady blocks until the guest agent answers, the VM dies, or ctx ends.
	WaitReady(ctx context.Context) (ReadyInfo, error)
	// RequestStop asks the VM to stop and returns without waiting. It is the
	// first step of the shutdown order: stop the VM, then wait for the
	// memory device's reads, then release the device.
	RequestStop() error
	// Wait blocks until the VMM process has exited and its resources are gone.
	Wait(ctx context.Context) error
}

// VMM restores snapshots.
type VMM interface {
	Restore(ctx context.Context, spec RestoreSpec) (VM, error)
}
