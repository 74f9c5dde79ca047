// Package repository is the contract between warmstart and the stores that
// keep its snapshots: a catalog of records (what a snapshot is and where its
// memory lies) plus the artifacts a restore needs (the VMM state file, the
// guest memory file, and the startup manifest once one has been recorded).
// Backends live in subpackages (posixfs for a local or shared POSIX file
// system); repotest is the behaviour suite every backend must pass.
//
// The contract is written for stores that are shared between processes and,
// for remote backends, between hosts: every operation takes a context, every
// visibility change is atomic, and nothing a crashed writer left half done is
// ever shown to a reader.
package repository

import (
	"context"
	"time"

	"warmstart/internal/layout"
)

// Artifact file names inside a snapshot. Backends that keep snapshots as
// files use these names, so an operator can recognise a snapshot on disk.
const (
	VMStateFileName  = "vm_state.bin"
	MemoryFileName   = "memory.bin"
	ManifestFileName = "startup-manifest.bin"
	// DigestsFileName holds the memory file's per-block table of CRC-32C
	// digests and SHA256DigestsFileName its table of SHA-256 digests
	// (package integrity); memory devices check every block against one of
	// them before serving it.
	DigestsFileName       = "memory.digests"
	SHA256DigestsFileName = "memory.sha256-digests"
)

// MaxManifestBytes caps the size of a startup manifest a repository accepts.
// It matches the cap of the manifest format, so a repository never stores a
// manifest no consumer would accept.
const MaxManifestBytes = 16 << 20

// RecordFormatVersion is the version of the Record encoding written by this
// build. A record with a higher version is refused rather than misread.
// Version 2 added MemoryFormat: a build that reads only version 1 would take
// a chunked memory file for a raw one, so it must refuse such records.
const RecordFormatVersion = 2

// Record is the catalog entry of one published snapshot. It is immutable
// except for Manifest, which AttachManifest sets, MemoryDigests, which
// AttachDigests sets, Refinement, which AttachRefinement sets and
// AttachManifest clears, and Signatures, which AttachSignature adds to.
type Record struct {
	// Format is the version of this encoding (RecordFormatVersion).
	Format int `json:"format"`
	// ID is the snapshot's UUIDv7 in canonical lowercase form.
	ID string `json:"id"`
	// Alias is the optional human name bound to the snapshot; "" when none.
	Alias string `json:"alias,omitempty"`
	// CreatedAt is when the snapshot was published (UTC).
	CreatedAt time.Time `json:"created_at"`
	// Layout is how guest memory lies in the memory file. Layout.FileSize
	// equals MemorySize.
	Layout layout.Layout `json:"layout"`
	// VMStateSize and VMStateSHA256 describe the VMM state file.
	VMStateSize   int64  `json:"vm_state_size"`
	VMStateSHA256 string `json:"vm_state_sha256"`
	// MemorySize and MemorySHA256 describe the memory file (the lower file
	// the memory device serves).
	MemorySize   int64  `json:"memory_size"`
	MemorySHA256 string `json:"memory_sha256"`
	// MemoryDigests describes the memory file's per-block table of
	// CRC-32C digests; nil for snapshots published before tables existed
	// (records of format 1), which restore unverified until `snapshot
	// verify --add-digests` adds one. Every record of format 2 has one
	// (RequiresDigests): one without is refused, not served unverified.
	MemoryDigests *DigestsDescriptor `json:"memory_digests,omitempty"`
	// MemorySHA256Digests describes the memory file's per-block table of
	// SHA-256 digests, which a writer cannot make other bytes match (see
	// package integrity for where a restore checks it); nil for
	// snapshots published before it existed, until `snapshot verify
	// --add-digests` adds one. A signed record always has one.
	MemorySHA256Digests *DigestsDescriptor `json:"memory_sha256_digests,omitempty"`
	// Manifest describes the attached startup manifest; nil when none is
	// attached.
	Manifest *ManifestDescriptor `json:"manifest,omitempty"`
	// ManifestRecording says how the attached manifest was recorded; nil
	// when its attacher did not say (and always when Manifest is nil).
	ManifestRecording *Recording `json:"manifest_recording,omitempty"`
	// ManifestRequested is set when the publisher records the manifest in
	// the background ([snapshot.memory_startup_pack] enabled). With
	// Manifest nil and no capture lease held, that recording was
	// interrupted (its process died), and a daemon resumes it at start.
	ManifestRequested bool `json:"manifest_requested,omitempty"`
	// MemoryFormat is how the memory file is stored: "" (records of format
	// 1) or MemoryFormatRaw for one file or object, MemoryFormatChunks for
	// a chunk map and content-addressed chunks (see MemoryChunks).
	MemoryFormat string `json:"memory_format,omitempty"`
	// MemoryChunks describes the chunk map of a MemoryFormatChunks file.
	MemoryChunks *ChunkMapDescriptor `json:"memory_chunks,omitempty"`
	// StartupPack describes the startup pack built when Manifest was
	// attached (backends that keep memory remotely); nil when none.
	StartupPack *StartupPackDescriptor `json:"startup_pack,omitempty"`
	// Refinement describes the learned manifest grown from Manifest by
	// restores (AttachRefinement); nil when none.
	Refinement *RefinementDescriptor `json:"refinement,omitempty"`
	// RefinedPack describes the startup pack a restore prefetching the
	// refinement streams (backends that keep memory remotely): built from
	// a refined manifest of this snapshot, the current one or an older
	// one still close enough to it (its index names the memory ranges it
	// holds); nil when none. It goes with the refinement.
	RefinedPack *StartupPackDescriptor `json:"refined_pack,omitempty"`
	// Parent is the snapshot this one was paused from ("" for a captured
	// or imported one): lineage only, the memory is named by MemoryLayers
	// and never found through Parent.
	Parent string `json:"parent,omitempty"`
	// MemoryLayers is the memory as a chain of layers, bottom first, set
	// exactly when MemoryFormat is MemoryFormatLayers: [0] is a full
	// memory file (the chain's base), each next one the pages that differ
	// from everything below it (Depth is its length less one).
	// MemorySHA256, MemoryDigests and MemorySHA256Digests then describe
	// nothing (each layer carries its own), and MemorySHA256 is empty.
	MemoryLayers []LayerDescriptor `json:"memory_layers,omitempty"`
	// DeletingSince marks a record a delete is checking for dependents
	// (backends without cross-node locks); outside the signed core.
	DeletingSince *time.Time `json:"deleting_since,omitempty"`
	// Signatures are Ed25519 signatures of the record's core
	// (SignedCore): the publisher's, made as Publish commits the record
	// when the backend was opened with a signing key, and any added
	// later (AttachSignature). A node that trusts keys restores the
	// snapshot only with a valid one by a key it trusts (package trust).
	// AttachDigests drops those its new table makes invalid.
	Signatures []Signature `json:"signatures,omitempty"`
}

// ManifestDescriptor identifies the bytes of an attached startup manifest.
// The repository computes it from the bytes it stored, so a consumer that
// finds a file whose size or SHA-256 differs knows the file is not the one
// that was attached and must fall back to on-demand reads.
type ManifestDescriptor struct {
	// SHA256 is the lowercase hex SHA-256 of the manifest bytes.
	SHA256 string `json:"sha256"`
	// Size is the manifest length in bytes.
	Size int64 `json:"size"`
}

// DigestsDescriptor identifies the digest table artifact of a memory file.
type DigestsDescriptor struct {
	// Algorithm is the table's integrity.Algorithm: "crc32c-4k"
	// (Record.MemoryDigests) or "sha256-4k" (Record.MemorySHA256Digests).
	Algorithm  string `json:"algorithm"`
	BlockBytes int64  `json:"block_bytes"`
	// SHA256 and Size are those of the encoded table.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Filter selects records for List. The zero Filter selects every record.
type Filter struct {
	// AliasPrefix, when not empty, selects records whose alias starts with
	// it; records without an alias are then left out. It uses the alias
	// alphabet; anything else is ErrInvalidRequest.
	AliasPrefix string
	// HasManifest, when not nil, selects records with (true) or without
	// (false) an attached manifest.
	HasManifest *bool
}

// Match reports whether r passes the filter.
func (f Filter) Match(r Record) bool {
	if f.AliasPrefix != "" && (len(r.Alias) < len(f.AliasPrefix) || r.Alias[:len(f.AliasPrefix)] != f.AliasPrefix) {
		return false
	}
	if f.HasManifest != nil && *f.HasManifest != (r.Manifest != nil) {
		return false
	}
	return true
}

// PublishRequest names the artifacts of a captured snapshot.
type PublishRequest struct {
	// VMStatePath and MemoryPath are the files the VMM wrote. They are
	// copied (reflinked where the file system can), so the caller may
	// change or remove them after Publish returns.
	VMStatePath string
	MemoryPath  string
	// Link, where the backend keeps local files, hard-links the sources
	// instead of copying them and makes their inode read-only (its write
	// bits taken away, nothing else changed: a private file stays
	// private). The caller promises never to write the sources again: a
	// write to them would change the published snapshot. Backends without
	// local files ignore it.
	Link bool
	// Layout is the guest memory layout. It must be valid and its FileSize
	// must equal the size of the memory file.
	Layout layout.Layout
	// Alias is bound to the snapshot when not empty.
	Alias string
	// RecordManifest says the caller records the startup manifest in the
	// background after Publish (Record.ManifestRequested).
	RecordManifest bool
	// Progress, when not nil, is called from Publish's goroutine as the
	// artifacts are imported. It must not block for long.
	Progress func(ImportProgress)
}

// Import steps reported through ImportProgress.Step.
const (
	// StepCopy: bytes are being copied into the repository.
	StepCopy = "copy"
	// StepVerify: the stored copy is being read back and hashed.
	StepVerify = "verify"
	// StepHash: a hard-linked or reflinked artifact is being hashed and
	// synced.
	StepHash = "hash"
)

// ImportProgress reports how far Publish has come with one artifact.
type ImportProgress struct {
	// Artifact is VMStateFileName or MemoryFileName.
	Artifact string
	// Step is StepCopy, StepVerify or StepHash.
	Step                  string
	DoneBytes, TotalBytes int64
}

// Lease is a capture lease: proof that its holder is still working on one
// snapshot. BeginCapture hands one out for a new snapshot; LeaseExisting for
// one already published. A holder keeps the lease while it publishes and
// while it records the startup manifest in the background, and ends it when
// done. A lease whose holder crashed ends by itself (the backend must not
// depend on the holder cleaning up).
type Lease interface {
	// SnapshotID is the id of the snapshot the lease is held on.
	SnapshotID() string
	// Done is closed once the lease has ended.
	Done() <-chan struct{}
	// End ends the lease. It waits for operations using the lease to finish,
	// so that after End returns no operation under this lease can change the
	// repository. End is idempotent.
	End() error
}

// Resolved is what a restore needs to reach one snapshot's artifacts.
type Resolved struct {
	Record Record
	// VMStatePath and MemoryPath are local files holding the artifacts
	// (MemoryPath is "" when Memory is set).
	// They stay valid until the snapshot is deleted; an open descriptor
	// keeps the data readable after that on POSIX file systems, so callers
	// open them before relying on them.
	VMStatePath string
	MemoryPath  string
	// DigestsPath and SHA256DigestsPath are the local digest tables of
	// the memory file, "" when Record.MemoryDigests or
	// Record.MemorySHA256Digests is nil. The consumer checks a table's
	// size and SHA-256 against its descriptor before trusting it.
	DigestsPath, SHA256DigestsPath string
	// ManifestPath is the local startup manifest, "" when Record.Manifest
	// is nil. The consumer must check its size, SHA-256 (against
	// Record.Manifest) and layout before using it, and fall back to
	// on-demand reads when any check fails.
	ManifestPath string
	// RefinementPath is the local refinement file, "" when
	// Record.Refinement is nil. The consumer checks what it reads against
	// Record.Refinement (ReadRefinedManifest, ReadRefinement) and falls
	// back to the recorded manifest when a check fails.
	RefinementPath string
	// Memory, when not nil, serves the memory file instead of a local
	// file: remote backends (s3) read it on demand through a node-local
	// cache, and MemoryPath is "".
	Memory MemorySource
}

// Repository stores snapshots. Implementations are safe for concurrent use
// by goroutines and, where the backend is shared, by processes: every
// guarantee below holds across processes, not only within one.
//
// IDs are canonical lowercase UUIDv7 strings and aliases match
// ^[A-Za-z0-9_-]{1,128}$ and do not parse as a UUID (ValidateID,
// ValidateAlias). Every method rejects any other id or alias with
// ErrInvalidRequest before touching storage.
//
// Errors wrap the sentinels of this package (ErrNotFound, ErrAliasConflict,
// ErrIntegrity, ErrInvalidRequest, ErrLeaseEnded) so callers branch with
// errors.Is; a cancelled context surfaces as ctx.Err() wrapped with context.
type Repository interface {
	// BeginCapture allocates a new snapshot id and returns a lease held on
	// it. Nothing becomes visible: the id has no record until Publish. A
	// capture abandoned without Publish (or by a crash) leaves nothing that
	// List, Get or ResolveAlias show; backends reclaim its storage once the
	// lease has ended.
	BeginCapture(ctx context.Context) (Lease, error)

	// Publish imports the artifacts named by req under the lease's id and
	// makes the snapshot visible. On success every artifact is durably
	// stored and checked (sizes and SHA-256 recorded in the Record), the
	// alias, if any, is bound, and the record is durable; the record write
	// is the single point at which the snapshot becomes visible.
	//
	// If req.Alias is bound to another visible snapshot, Publish fails with
	// ErrAliasConflict (backends check early, before importing, and decide
	// atomically at the end). When two publishers race for one alias, in
	// this or other processes, exactly one wins. A failed Publish, for any reason
	// and at any point (including a crash), leaves no visible record,
	// releases the alias and reclaims the imported artifacts; the same
	// alias can be published again afterwards.
	//
	// Publish fails with ErrLeaseEnded if the lease has ended, with
	// ErrInvalidRequest if the lease was not issued by this repository, was
	// already published, or req is invalid (missing or non-regular files,
	// invalid layout, layout FileSize differing from the memory file's
	// size), and with ErrIntegrity if a stored copy does not read back as
	// the bytes that were written. The lease stays held after Publish: end
	// it when background work on the snapshot (manifest recording) is done.
	Publish(ctx context.Context, lease Lease, req PublishRequest) (Record, error)

	// LeaseHeld reports whether a capture lease on id is held now, by this
	// or (where the backend can tell) another process: a recording of its
	// manifest is in progress. It changes nothing.
	LeaseHeld(ctx context.Context, id string) (bool, error)

	// LeaseExisting takes a lease on a published snapshot, so a manifest can
	// be recorded for it on demand. It fails with ErrNotFound if no record
	// exists for id. Several leases may be held on one snapshot at once.
	LeaseExisting(ctx context.Context, id string) (Lease, error)

	// ClaimLease takes a lease on a published snapshot only if no other
	// lease on it is held, by this or (where the backend can tell) another
	// process, and of several claims racing for one snapshot at most one
	// succeeds. It returns ok false, and no lease, when the snapshot is
	// taken. The daemon claims a snapshot before it resumes an interrupted
	// recording, so two daemons starting at once do not both record it.
	// It fails with ErrNotFound if no record exists for id.
	ClaimLease(ctx context.Context, id string) (lease Lease, ok bool, err error)

	// Get returns the record of id, or ErrNotFound. A record that cannot be
	// decoded is reported as ErrIntegrity.
	Get(ctx context.Context, id string) (Record, error)

	// List returns the visible records that match f, oldest first (ids are
	// UUIDv7, so id order is creation order). Snapshots being published,
	// half-written files left by crashes, and records that cannot be decoded
	// are never listed: Damaged reports the last.
	List(ctx context.Context, f Filter) ([]Record, error)

	// Damaged reports every catalog entry that exists but cannot be
	// decoded (records and alias bindings), in place or already moved to
	// QuarantineDir, sorted by SortDamage. It changes nothing, so it works
	// on a store opened read-only. Writers (the sweep of a writable open)
	// move damaged entries to QuarantineDir; never delete them. A damaged
	// or quarantined alias binding keeps its alias taken: Publish with it
	// fails with ErrAliasConflict (DamagedAliasError) until an operator
	// removes the quarantined entry or deletes the snapshot whose record
	// carries the alias, and the artifacts of a quarantined record are
	// kept until its id is deleted.
	Damaged(ctx context.Context) ([]Damage, error)

	// ResolveAlias returns the id bound to alias, or ErrNotFound when the
	// alias is unbound or bound to a snapshot that is no longer visible
	// (then DanglingAliasError, naming the alias and the id).
	ResolveAlias(ctx context.Context, alias string) (string, error)

	// Lookup returns the record named by ref: an id if ref parses as a
	// UUID (and then it must be a canonical UUIDv7), an alias otherwise.
	Lookup(ctx context.Context, ref string) (Record, error)

	// Resolve returns local paths to the artifacts of id, after checking
	// that they exist and have the sizes the record gives (ErrIntegrity
	// otherwise; ErrNotFound when the snapshot was deleted meanwhile). It does not hash the memory file; restore cannot afford
	// that on every start. Backends that keep artifacts remotely fetch them
	// into a local cache here.
	Resolve(ctx context.Context, id string) (Resolved, error)

	// Delete removes the snapshot: its record, every alias binding naming
	// id (the one its record carries, the unknown one of a record that does
	// not decode, in place or quarantined, and any a crash left naming it)
	// and its artifacts, under the snapshot's record lock so no
	// AttachManifest can interleave. A binding a publisher took over
	// meanwhile is its new holder's and stays. The record goes first, so a reader never sees a record
	// whose artifacts are gone. Deleting an id that does not exist is not an
	// error (Delete is idempotent); it still reclaims leftovers of a crashed
	// publish or delete of that id, among them alias bindings still naming
	// it (a dangling alias: DeleteRef releases one this way; a backend may
	// keep a binding young enough to be a publish's still running). Leases on the snapshot are not waited
	// for; their holders learn of the deletion from ErrNotFound.
	Delete(ctx context.Context, id string) error

	// AttachManifest stores data as the startup manifest of the lease's
	// snapshot and records its descriptor in the record, both durably and
	// under the record lock. It never recreates a deleted snapshot: it
	// fails with ErrNotFound, changing nothing, if the record no longer
	// exists, and with ErrLeaseEnded if the lease has ended. A crash at any
	// point leaves the record either with no descriptor or with a
	// descriptor that matches the stored manifest. Attaching again replaces
	// the manifest. data must be 1..MaxManifestBytes long
	// (ErrInvalidRequest); its format is the caller's to validate. rec,
	// when not nil, goes into the record with the descriptor (ManifestRecording)
	// and must be valid (ErrInvalidRequest).
	AttachManifest(ctx context.Context, lease Lease, data []byte, rec *Recording) (ManifestDescriptor, error)

	// AttachDigests stores data as a digest table of the lease's
	// snapshot's memory file (DigestsFileName for a table of CRC-32C
	// digests, SHA256DigestsFileName for one of SHA-256: the table's
	// header says) and records its descriptor in the record, with AttachManifest's guarantees: durably and under
	// the record lock, never recreating a deleted snapshot (ErrNotFound,
	// changing nothing), ErrLeaseEnded once the lease has ended, and a
	// crash at any point leaves the record either with no descriptor or
	// with one that matches the stored table. Attaching again replaces the
	// table. data must decode as a table of a file of the record's
	// MemorySize (integrity.Decode; ErrInvalidRequest otherwise). That the
	// table describes the memory file's bytes is the caller's to check:
	// `snapshot verify --add-digests` computes it from a memory file whose
	// SHA-256 it has just checked against the record.
	AttachDigests(ctx context.Context, lease Lease, data []byte) (DigestsDescriptor, error)

	// AttachRefinement stores r as the learned manifest of the lease's
	// snapshot and records its descriptor, with AttachManifest's
	// guarantees (durably, under the record lock, never recreating a
	// deleted snapshot: ErrNotFound, changing nothing; ErrLeaseEnded once
	// the lease has ended), except that a crash at any point leaves the
	// record with the old refinement and its file or with the new ones:
	// the file is named by its SHA-256 (RefinementFileName), and the old
	// one is removed only after the new record is durable. It is refused
	// with ErrInvalidRequest when r's parts are empty or too large, and with ErrStale when r.BaseSHA256 is not the record's
	// manifest (a new recording since) or r.PreviousSHA256 not its
	// refinement (another learner was first). The recorded manifest is
	// left as it is; AttachManifest with other bytes clears the
	// refinement.
	AttachRefinement(ctx context.Context, lease Lease, r Refinement) (RefinementDescriptor, error)

	// AttachSignature adds sig to the record of the lease's snapshot,
	// replacing a signature by the same key, with AttachManifest's
	// guarantees (durably, under the record lock, never recreating a
	// deleted snapshot: ErrNotFound, changing nothing; ErrLeaseEnded
	// once the lease has ended); it stores no file. sig must be well
	// formed (ErrInvalidRequest) and verify over the record as it is
	// under the lock (ErrStale otherwise: the record changed since it
	// was read and signed; read it again and sign anew). Whether its key
	// is to be trusted is not the repository's to judge.
	AttachSignature(ctx context.Context, lease Lease, sig Signature) error

	// Layers: PublishLayer, ReplaceMemory and Dependents.
	Layers
}
