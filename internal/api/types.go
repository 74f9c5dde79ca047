// Package api is the daemon's HTTP API as its clients see it: the bodies
// of its requests and answers, the Go client that sends them, and how a
// client finds its bearer token. The daemon (the server), the operations
// that fill the answers, the printers and the CLI all name these types
// here, so none of them imports another to speak the API.
package api

import (
	"time"
	"warmstart/internal/layers"
	"warmstart/internal/pause"

	"warmstart/internal/memdev"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
	"warmstart/internal/trust"
	"warmstart/internal/vmm"
)

// Error is the body of every answer with a 4xx or 5xx status.
type Error struct {
	Error string `json:"error"`
	// Field names the request field at fault: a JSON field, a path
	// parameter ("id"), a query parameter, or "body" for the body as a whole.
	Field string `json:"field,omitempty"`
}

// Health is the body of GET /healthz (always HTTP 200 while serving).
type Health struct {
	// Status is "ok", or "degraded" when restores will fail: the
	// configured VMM cannot run on this host (Reason says why).
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	Restores int    `json:"restores"`
}

// ImportRequest is the body of POST /snapshots/import: files on the
// daemon's host, given by absolute paths.
type ImportRequest struct {
	VMState string `json:"vm_state"`
	Memory  string `json:"memory"`
	Alias   string `json:"alias,omitempty"`
	// Layout is offset:size[:pagesize],... as layout.Parse reads it; empty
	// means one region over the whole memory file.
	Layout string `json:"layout,omitempty"`
	// Link hard-links the files into the store instead of copying them
	// and makes them read-only: the caller must never write them again.
	Link bool `json:"link,omitempty"`
}

// ImportResponse is the published record.
type ImportResponse struct {
	repository.Record
	// Recording is true when the startup manifest is being recorded in
	// the background ([manifest] record_after_publish).
	Recording bool `json:"recording"`
}

// SnapshotInfo is the body of GET /snapshots/{id}.
type SnapshotInfo struct {
	repository.Record
	// Files are where the artifacts are on the daemon's host; absent, with
	// FilesError saying why, when they do not check out.
	Files      *SnapshotFiles `json:"files,omitempty"`
	FilesError string         `json:"files_error,omitempty"`
	// Trust is what the daemon's trusted keys make of the record's
	// signatures: verified, refused (restores fail with 403) or
	// unverified (it trusts no key).
	Trust trust.Status `json:"trust"`
}

// SnapshotFiles are a snapshot's artifacts.
type SnapshotFiles struct {
	VMState string `json:"vm_state"`
	// Memory is the memory file: "" for a layered snapshot, whose memory
	// is MemoryLayers, and in a repository that serves memory remotely.
	Memory string `json:"memory"`
	// MemoryLayers are a layered snapshot's layer data files, base
	// first; absent when the layers are remote.
	MemoryLayers []string `json:"memory_layers,omitempty"`
	Manifest     string   `json:"manifest,omitempty"`
}

// DeleteResponse is the body of a successful DELETE /snapshots/{id}.
type DeleteResponse struct {
	ID    string `json:"id"`
	Alias string `json:"alias,omitempty"`
	// Released: the alias named a snapshot that no longer exists (ID),
	// and its binding was released; no snapshot was deleted.
	Released bool `json:"released,omitempty"`
}

// VerifyRequest is the optional body of POST /snapshots/{id}/verify.
type VerifyRequest struct {
	// AddDigests attaches the freshly computed digest tables a snapshot
	// lacks, if its memory file matches the record's SHA-256.
	AddDigests bool `json:"add_digests,omitempty"`
	// Cache, unless false, also checks what the daemon's node cache holds
	// of the snapshot's memory and evicts blocks that fail
	// (snapcheck.Options.Cache).
	Cache *bool `json:"cache,omitempty"`
}

// RestoreRequest is the body of POST /restores. Empty fields take the
// daemon's configuration.
type RestoreRequest struct {
	// Snapshot is an id or alias.
	Snapshot string `json:"snapshot"`
	// Device is "file" or "uffd"; default [memory] device.
	Device string `json:"device,omitempty"`
	// Prefetch is "auto" (the default: [prefetch] on_restore),
	// "on" or "off".
	Prefetch string `json:"prefetch,omitempty"`
	// Policy is a prefetch policy name; default [prefetch] policy.
	Policy string `json:"policy,omitempty"`
	// IOEngine is 0, 1 or 2; default [memory] io_engine.
	IOEngine *int `json:"io_engine,omitempty"`
	// Pausable restores the VM so that it can be paused into a child
	// snapshot (POST /restores/{id}/snapshot).
	Pausable bool `json:"pausable,omitempty"`
}

// PauseRequest pauses a pausable restore into a child snapshot.
type PauseRequest struct {
	// Alias is bound to the child when not empty.
	Alias string `json:"alias,omitempty"`
	// Then is "resume" (the default: the VM runs on as soon as its state
	// is saved) or "stop" (the VM stops once the child is published).
	Then string `json:"then,omitempty"`
}

// Pause's Then values.
const (
	ThenResume = "resume"
	ThenStop   = "stop"
)

// PauseResult is a published child snapshot.
type PauseResult struct {
	// Snapshot is the child's id, Parent the snapshot it was paused from,
	// Depth its number of diff layers.
	Snapshot string `json:"snapshot"`
	Alias    string `json:"alias,omitempty"`
	Parent   string `json:"parent"`
	Depth    int    `json:"depth"`
	// Flattened says the child would have passed [pause] max_depth and
	// was published with one diff layer over its chain's base, merging
	// the parent's diff layers and the changed pages.
	Flattened bool          `json:"flattened"`
	Pages     layers.Counts `json:"pages"`
	Timings   pause.Timings `json:"timings"`
	// Stop is the restore's shutdown with then=stop.
	Stop *restore.StopReport `json:"stop,omitempty"`
	// StopError says why that stop failed, after the child was published
	// (which the rest of the result describes); empty when it did not.
	StopError string `json:"stop_error,omitempty"`
}

// RestoreInfo describes a restore the daemon holds. Prefetch and
// DeviceBytes are as they were at ready.
type RestoreInfo struct {
	ID          string                 `json:"id"`
	Snapshot    string                 `json:"snapshot"`
	Device      string                 `json:"device"`
	IOEngine    int                    `json:"io_engine"`
	Policy      string                 `json:"policy"`
	Generation  uint64                 `json:"generation"`
	StartedAt   time.Time              `json:"started_at"`
	Timings     restore.Timings        `json:"timings"`
	Prefetch    restore.PrefetchReport `json:"prefetch"`
	DeviceBytes memdev.Counters        `json:"device_bytes"`
	// Cost is what the restore cost the host until ready: CPU, faults and
	// storage reads of the node and VMM processes, bytes read and copied.
	Cost restore.Cost `json:"cost"`
	// Passthrough, when true, says the kernel served the guest's memory
	// from the local lower file (FUSE passthrough, [memory] passthrough):
	// no block was checked before the guest saw it.
	Passthrough bool `json:"passthrough,omitempty"`
	// StartupSet accounts for the startup set at ready.
	StartupSet startupset.Report `json:"startup_set"`
	// Ready is what the VMM driver reported at ready (the replay VMM's
	// hash of what it read, a real guest's token), typed.
	Ready vmm.ReadyDetail `json:"ready"`
	// State is "running", or "exited" once the VM's process has exited on
	// its own (crashed, killed, shut down by its guest); Exit then says
	// how. An exited restore is held until DELETE releases its device.
	// A verb that stopped the restore prints "stopped" and Stop.
	State string           `json:"state"`
	Exit  *vmm.ProcessExit `json:"exit,omitempty"`
	// Stop is how the restore stopped, once a verb stopped it.
	Stop *restore.StopReport `json:"stop,omitempty"`
}

// StopResponse is the body of DELETE /restores/{id}.
type StopResponse struct {
	ID string `json:"id"`
	restore.StopReport
}
