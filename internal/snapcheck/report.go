package snapcheck

import (
	"fmt"

	"warmstart/internal/repository"
)

// Report is what Verify found of one snapshot. Its JSON form (snake_case
// keys, sizes and offsets as numbers) is what `snapshot verify --json`
// prints and what the daemon's POST /snapshots/{id}/verify answers.
type Report struct {
	ID    string `json:"id"`
	Alias string `json:"alias,omitempty"`
	// OK is true when no problem was found. A snapshot without a digest
	// table can be OK: Unverified says so.
	OK bool `json:"ok"`
	// Unverified is true when the snapshot has no digest table (it was
	// published before tables existed and none was added), so restores
	// serve its memory unverified.
	Unverified bool `json:"unverified"`
	// DigestsAdded and SHA256DigestsAdded are the descriptors of the
	// tables Options.AddDigests attached (CRC-32C, SHA-256).
	DigestsAdded       *repository.DigestsDescriptor `json:"digests_added,omitempty"`
	SHA256DigestsAdded *repository.DigestsDescriptor `json:"sha256_digests_added,omitempty"`
	// Problems are about the snapshot as a whole: a record that cannot be
	// read, an alias binding the record contradicts, or artifacts the
	// repository cannot resolve.
	Problems []Problem `json:"problems,omitempty"`
	// Cache is what Options.Cache found of the snapshot's memory in this
	// node's cache; nil when it was not checked or the repository keeps
	// none (posixfs).
	Cache *CacheReport `json:"cache,omitempty"`
	// Artifacts are vm_state.bin, memory.bin, memory.digests,
	// memory.sha256-digests and startup-manifest.bin, in that order.
	Artifacts []Artifact `json:"artifacts"`
}

// Artifact statuses.
const (
	// StatusOK: read whole and as the record describes it.
	StatusOK = "ok"
	// StatusBad: at least one problem.
	StatusBad = "bad"
	// StatusAbsent: the record describes none (no manifest attached, no
	// digest table); not a problem by itself.
	StatusAbsent = "absent"
	// StatusAdded: the digest table Options.AddDigests attached.
	StatusAdded = "added"
	// StatusNotChecked: not read, because something before it failed.
	StatusNotChecked = "not_checked"
)

// Artifact is what Verify found of one artifact.
type Artifact struct {
	Name string `json:"name"`
	// Layer is the index in the chain of a layered snapshot's layer this
	// file belongs to (Name is then "<owner id>/<file>"); nil otherwise.
	Layer  *int   `json:"layer,omitempty"`
	Status string `json:"status"`
	// Size and SHA256 are what the record says (zero and "" when it
	// describes none).
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
	// ReadBytes is how many bytes were read; ReadSHA256 their SHA-256,
	// when the artifact was read to its end.
	ReadBytes  int64  `json:"read_bytes"`
	ReadSHA256 string `json:"read_sha256,omitempty"`
	// Blocks is the comparison of memory.bin with its digest table; nil
	// when there was none to compare with.
	Blocks *Blocks `json:"blocks,omitempty"`
	// Note says what a reader should know that is not a problem.
	Note     string    `json:"note,omitempty"`
	Problems []Problem `json:"problems,omitempty"`
}

// Blocks compares the memory file block by block with its stored table.
type Blocks struct {
	BlockBytes int64 `json:"block_bytes"`
	// Checked is the number of blocks in the table, Bad the number whose
	// bytes do not match their digest (or that lie past the end of a
	// memory file shorter than the record says).
	Checked int64 `json:"checked"`
	Bad     int64 `json:"bad"`
	// BadRanges are the bad blocks, consecutive ones merged, in offset
	// order.
	BadRanges []Range `json:"bad_ranges"`
}

// Range is a run of consecutive bad blocks of the memory file.
type Range struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
	Blocks int64 `json:"blocks"`
}

// Problem kinds.
const (
	KindMissing    = "missing"     // the artifact is not there
	KindNotRegular = "not_regular" // a symlink, FIFO, directory, device
	KindSize       = "size"        // its size differs from the record's
	KindSHA256     = "sha256"      // its SHA-256 differs from the record's
	KindInvalid    = "invalid"     // it does not decode, or not for this snapshot
	KindBadBlocks  = "bad_blocks"  // memory blocks differ from the table
	KindRead       = "read"        // reading it failed
	KindUnresolved = "unresolved"  // the repository refused to resolve it
	KindRecord     = "record"      // the snapshot's record cannot be read
	KindAlias      = "alias"       // an alias binding and the record contradict each other
	KindNotAdded   = "not_added"   // AddDigests refused to attach a table
	KindAttach     = "attach"      // attaching the table failed
	KindCache      = "cache"       // blocks of the node cache failed their check (evicted)
	KindTrust      = "trust"       // the node's trusted keys refuse the snapshot
)

// Problem is one thing wrong with a snapshot.
type Problem struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// artifact returns the report's entry for name.
func (r *Report) artifact(name string) *Artifact {
	for i := range r.Artifacts {
		if r.Artifacts[i].Name == name {
			return &r.Artifacts[i]
		}
	}
	panic("snapcheck: no artifact " + name) // the names are this package's constants
}

// problem records a problem with the artifact and marks it bad.
func (a *Artifact) problem(kind, format string, args ...any) {
	a.Status = StatusBad
	a.Problems = append(a.Problems, Problem{Kind: kind, Message: fmt.Sprintf(format, args...)})
}

// finish sets OK from the problems found.
func (r *Report) finish() {
	r.OK = len(r.Problems) == 0
	for _, a := range r.Artifacts {
		if len(a.Problems) > 0 {
			r.OK = false
		}
	}
}

// newReport is the report of rec before anything was read.
func newReport(rec repository.Record) Report {
	if rec.Layered() {
		return newLayeredReport(rec)
	}
	r := Report{ID: rec.ID, Alias: rec.Alias, Artifacts: []Artifact{
		{Name: repository.VMStateFileName, Size: rec.VMStateSize, SHA256: rec.VMStateSHA256},
		{Name: repository.MemoryFileName, Size: rec.MemorySize, SHA256: rec.MemorySHA256},
		{Name: repository.DigestsFileName},
		{Name: repository.SHA256DigestsFileName},
		{Name: repository.ManifestFileName},
	}}
	for name, d := range map[string]*repository.DigestsDescriptor{
		repository.DigestsFileName: rec.MemoryDigests, repository.SHA256DigestsFileName: rec.MemorySHA256Digests,
	} {
		if d != nil {
			a := r.artifact(name)
			a.Size, a.SHA256 = d.Size, d.SHA256
		}
	}
	if m := rec.Manifest; m != nil {
		a := r.artifact(repository.ManifestFileName)
		a.Size, a.SHA256 = m.Size, m.SHA256
	}
	appendAttachments(&r, rec)
	for i := range r.Artifacts {
		r.Artifacts[i].Status = StatusNotChecked
	}
	return r
}

// appendAttachments adds the refinement and the startup packs rec has.
func appendAttachments(r *Report, rec repository.Record) {
	if d := rec.Refinement; d != nil {
		r.Artifacts = append(r.Artifacts, Artifact{Name: repository.RefinementFileName(d.SHA256), Size: d.Size, SHA256: d.SHA256})
	}
	if rec.StartupPack != nil || rec.RefinedPack != nil {
		// The recorded manifest's pack and the refined one's, as one.
		var size int64
		for _, p := range []*repository.StartupPackDescriptor{rec.StartupPack, rec.RefinedPack} {
			if p != nil {
				size += p.StoredBytes
			}
		}
		r.Artifacts = append(r.Artifacts, Artifact{Name: StartupPackArtifact, Size: size})
	}
}

// newLayeredReport is newReport of a layered record: its VM state and
// manifest, then every layer's files.
func newLayeredReport(rec repository.Record) Report {
	r := Report{ID: rec.ID, Alias: rec.Alias, Artifacts: []Artifact{
		{Name: repository.VMStateFileName, Size: rec.VMStateSize, SHA256: rec.VMStateSHA256},
		{Name: repository.ManifestFileName},
	}}
	if m := rec.Manifest; m != nil {
		a := r.artifact(repository.ManifestFileName)
		a.Size, a.SHA256 = m.Size, m.SHA256
	}
	r.Artifacts = append(r.Artifacts, layerArtifacts(rec)...)
	appendAttachments(&r, rec)
	for i := range r.Artifacts {
		r.Artifacts[i].Status = StatusNotChecked
	}
	return r
}
