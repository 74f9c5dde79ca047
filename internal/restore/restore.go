// Package restore orchestrates one snapshot restore and its shutdown: it
// acquires the memory device, validates the startup manifest, starts the
// prefetch concurrently with the VMM loading the snapshot, waits for the
// guest to be ready, and stops in the seed's order (stop the VM, wait for
// the prefetch reads to exit, keep the device until then, release it and
// wait for the acknowledgement).
package restore

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/refine"
	"warmstart/internal/repository"
	"warmstart/internal/trust"
	"warmstart/internal/vmm"
)

// Mode chooses whether a restore prefetches.
type Mode string

const (
	// ModeAuto prefetches when [prefetch] on_restore is on and a valid manifest exists.
	ModeAuto Mode = "auto"
	// ModeOn prefetches whenever a valid manifest exists.
	ModeOn Mode = "on"
	// ModeOff never prefetches.
	ModeOff Mode = "off"
)

// ParseMode reads a --prefetch value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeOn, ModeOff:
		return m, nil
	}
	return "", fmt.Errorf("prefetch mode %q: want auto, on or off", s)
}

// Source is what a restore needs from the repository. Resolving it is not
// part of a restore (nor of its timing).
type Source struct {
	SnapshotID   string        `json:"snapshot_id"`
	VMStatePath  string        `json:"vm_state_path"`
	Layout       layout.Layout `json:"layout"`
	ManifestPath string        `json:"manifest_path,omitempty"`
	// Manifest is the descriptor the record carries; nil when none is attached.
	Manifest *manifest.Descriptor `json:"manifest,omitempty"`
	// Memory is the snapshot's memory, which the device serves: a local
	// file (memdev.File) or a remote store's (repository.MemorySource);
	// required. What it can do besides serving bytes, the restore asks
	// for with capability interfaces (source.go).
	Memory memdev.Source `json:"-"`
	// VMStateSize and VMStateSHA256 are what the record says of the VMM
	// state file; the restore checks it before the VMM reads it.
	VMStateSize   int64  `json:"vm_state_size"`
	VMStateSHA256 string `json:"vm_state_sha256"`
	// Digests and DigestsPath are the memory file's table of CRC-32C
	// digests, SHA256Digests and SHA256DigestsPath its table of SHA-256
	// digests; the memory device checks every block against one of them
	// (see verify.go).
	Digests     *repository.DigestsDescriptor `json:"digests,omitempty"`
	DigestsPath string                        `json:"digests_path,omitempty"`

	SHA256Digests     *repository.DigestsDescriptor `json:"sha256_digests,omitempty"`
	SHA256DigestsPath string                        `json:"sha256_digests_path,omitempty"`
	// Refinement and RefinementPath are the learned manifest (refined.go);
	// nil and "" when the snapshot has none.
	Refinement     *repository.RefinementDescriptor `json:"refinement,omitempty"`
	RefinementPath string                           `json:"refinement_path,omitempty"`
	// Gone, when set, says whether the snapshot was deleted since it was
	// resolved (DeletedFrom): a file missing then went with it, while one
	// missing from a snapshot still there is damage. Nil: a missing file
	// is damage.
	Gone func() bool `json:"-"`
	// Record is the record the source was made from (SourceOf); nil for
	// one made without a record (tests of the device alone). The restore
	// checks it before any memory is served (verify.go).
	Record *repository.Record `json:"record,omitempty"`
}

// SourceOf adapts a resolved repository record.
func SourceOf(r repository.Resolved) Source {
	s := Source{
		SnapshotID:   r.Record.ID,
		VMStatePath:  r.VMStatePath,
		Layout:       r.Record.Layout,
		ManifestPath: r.ManifestPath,
		Memory:       r.MemorySource(),

		VMStateSize:   r.Record.VMStateSize,
		VMStateSHA256: r.Record.VMStateSHA256,
		Digests:       r.Record.MemoryDigests,
		DigestsPath:   r.DigestsPath,

		SHA256Digests:     r.Record.MemorySHA256Digests,
		SHA256DigestsPath: r.SHA256DigestsPath,

		Refinement:     r.Record.Refinement,
		RefinementPath: r.RefinementPath,

		Record: &r.Record,
	}
	if d := r.Record.Manifest; d != nil {
		s.Manifest = &manifest.Descriptor{SHA256: d.SHA256, Size: d.Size}
	}
	return s
}

// Options choose how one restore runs.
type Options struct {
	// Device is the kind of memory device (memdev.Opener.Kind); the
	// restorer's first when empty.
	Device   string
	IOEngine int
	Prefetch Mode
	Policy   Policy
	// Trace records the device's first touches until ready (the recorder).
	Trace bool
	// DeviceKey names the FUSE device the restore shares; the snapshot id
	// when empty. The recorder uses a private key so that no other VM's
	// cached pages hide touches from its trace.
	DeviceKey string
	// Touched, when set, says which pages brought into the guest's reach
	// it touched (a device-specific probe); the restore's Observation
	// then counts exactly those. Nil: on the file device, the VMM
	// process's page tables at ready (package residency); elsewhere the
	// device's own view (refine).
	Touched refine.Touched `json:"-"`
	// Unverified serves memory without checking it against the snapshot's
	// digest table: the lab's +noverify columns, which measure what
	// verification costs. The request layer never sets it.
	Unverified bool `json:"-"`
	// StrongDigests checks memory against the SHA-256 table, as a node
	// that trusts keys does, on a node that does not: the lab's +sha256
	// columns, which measure what a trusting node's checks cost. The
	// request layer never sets it.
	StrongDigests bool `json:"-"`
	// Pausable restores the VM so that it can be paused into a child
	// snapshot (Instance.Freeze): the VMM is asked for it and, for one
	// that writes guest memory back, the device gives a writable view.
	Pausable bool `json:"pausable,omitempty"`
}

// Restorer restores snapshots. One per process (the daemon) or per trial.
type Restorer struct {
	// Devices attach the memory devices restores run on; the first is the
	// default (Options.Device empty).
	Devices memdev.Devices
	// Engine runs prefetch tasks; shared so tasks are shared.
	Engine *prefetch.Engine
	VMM    vmm.VMM
	// ConsumeEnabled is [prefetch] on_restore.
	ConsumeEnabled bool
	// Refine is [manifest] refine: prefetch the
	// snapshot's learned manifest when it has one (refined.go).
	Refine bool
	// RuntimeDir holds a private directory per restore.
	RuntimeDir string
	Log        *slog.Logger
	// Observe, when set, is told of each decision (for metrics).
	Observe Observer
	// Trust, when it trusts keys, refuses before anything of a snapshot
	// is read one whose record no trusted key signed (verify.go).
	Trust *trust.Policy
}

// Observer receives restore events; every method may be called concurrently.
type Observer interface {
	ManifestRejected(reason string)
	PrefetchSkipped(reason string)
	PrefetchEnded(state prefetch.State)
	Phases(t Timings)
}

// Timings are measured from the call to Restore.
type Timings struct {
	DeviceAcquired    time.Duration `json:"device_acquired_ns"`
	ManifestValidated time.Duration `json:"manifest_validated_ns"`
	VMStarted         time.Duration `json:"vm_started_ns"`
	Ready             time.Duration `json:"ready_ns"`
	// StreamStarted, StreamFirstBlock and StreamEnded are when a remote
	// memory source's startup stream (its startup pack streaming into the
	// node cache) was started, delivered its first block and ended; zero
	// when there was none or it had not by ready. They say where a cold
	// node's time goes.
	StreamStarted    time.Duration `json:"stream_started_ns,omitempty"`
	StreamFirstBlock time.Duration `json:"stream_first_block_ns,omitempty"`
	StreamEnded      time.Duration `json:"stream_ended_ns,omitempty"`
}

// LogValue makes the timings one group of durations in a structured log line.
func (t Timings) LogValue() slog.Value {
	return slog.GroupValue(slog.Duration("device_acquired", t.DeviceAcquired),
		slog.Duration("manifest_validated", t.ManifestValidated), slog.Duration("vm_started", t.VMStarted),
		slog.Duration("ready", t.Ready))
}

// PrefetchReport says what prefetch did for one restore.
type PrefetchReport struct {
	// State is "skipped", or the task state at ready: running, completed, ...
	State string `json:"state"`
	// Reason says why prefetch was skipped or failed.
	Reason string `json:"reason,omitempty"`
	// PlannedBytes is the manifest's total.
	PlannedBytes int64 `json:"planned_bytes"`
	// LeftToDemandBytes is the part of PlannedBytes the memory source
	// asked prefetch to leave to demand faults (PrefetchTrimmer: on S3,
	// pages neither its startup pack nor the node cache holds).
	LeftToDemandBytes int64 `json:"left_to_demand_bytes,omitempty"`
	// GapBytes is what the plan reads beyond the manifest: the small gaps
	// between recorded ranges it takes along (Policy.GapBytes).
	GapBytes int64 `json:"gap_bytes,omitempty"`
	// Manifest is which manifest was prefetched: ManifestRecorded or
	// ManifestRefined; empty when none was.
	Manifest string `json:"manifest,omitempty"`
	// Fallback says why the refined manifest was not used although the
	// snapshot has one and refine is on.
	Fallback string `json:"fallback,omitempty"`
	// StartupPackSkipped says why the memory source went without its
	// startup pack (missing, damaged, not matching the manifest) and read
	// the startup set from its chunks instead: the cold restore is slower.
	StartupPackSkipped string `json:"startup_pack_skipped,omitempty"`
	// Task is the shared task's key, when one ran.
	Generation uint64 `json:"generation,omitempty"`
	Digest     string `json:"digest,omitempty"`
	// EndedAfter is when the task ended, from the start of the restore,
	// if it ended before ready: prefetch that outlives ready overlapped
	// the whole restore.
	EndedAfter time.Duration `json:"ended_after_ns,omitempty"`
}

// Restore restores src and returns once its guest is ready, in the seed's
// sequence: acquire the memory device, validate the manifest, prefetch
// alongside the VMM loading the snapshot, wait for ready. On error every
// resource it took is released.
func (r *Restorer) Restore(ctx context.Context, src Source, opts Options) (*Instance, error) {
	t0 := time.Now()
	opts = opts.withDefaults()
	if err := r.checkTrust(src); err != nil {
		return nil, fmt.Errorf("restore %s: %w", src.SnapshotID, err)
	}
	s, err := r.newSequence(t0, src, opts)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", src.SnapshotID, err)
	}
	if err := s.run(ctx); err != nil {
		err = fmt.Errorf("restore %s: %w", src.SnapshotID, err)
		s.abandon(err)
		return nil, err
	}
	if r.Observe != nil {
		r.Observe.Phases(s.inst.Timings)
	}
	s.held.exit.watch(s.held.vm)
	return s.inst, nil
}

// withDefaults fills in the default policy.
func (o Options) withDefaults() Options {
	if o.Policy.Name == "" {
		o.Policy, _ = LookupPolicy(DefaultPolicy)
	}
	return o
}
