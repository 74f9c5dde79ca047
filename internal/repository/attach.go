package repository

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"warmstart/internal/integrity"
)

// Attachment is an artifact added to a published snapshot after publish,
// as a backend stores it: the startup manifest (AttachManifest) or the
// memory file's digest table (AttachDigests). Both are attached the same
// way, under the same guarantees, so backends run one code path for both
// and ask the Attachment what differs: the file name, how the bytes are
// validated against the record, and which descriptor of the record
// describes them.
type Attachment struct {
	// Name is the artifact's file name (ManifestFileName or
	// DigestsFileName).
	Name string
	// Data is what is stored.
	Data []byte

	manifest  *ManifestDescriptor
	recording *Recording
	digests   *DigestsDescriptor
}

// ManifestAttachment is data as a startup manifest, recorded as rec says
// (nil: not said). data must be 1..MaxManifestBytes long and rec valid
// (ErrInvalidRequest); data's format is the caller's to validate.
func ManifestAttachment(data []byte, rec *Recording) (Attachment, error) {
	if len(data) == 0 || len(data) > MaxManifestBytes {
		return Attachment{}, fmt.Errorf("%w: manifest of %d bytes is outside 1..%d", ErrInvalidRequest, len(data), MaxManifestBytes)
	}
	if rec != nil {
		if err := rec.Validate(); err != nil {
			return Attachment{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		rec = &Recording{Runs: rec.Runs, Overlap: rec.Overlap, RankCorrelation: rec.RankCorrelation}
	}
	sum := sha256.Sum256(data)
	d := ManifestDescriptor{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
	return Attachment{Name: ManifestFileName, Data: data, manifest: &d, recording: rec}, nil
}

// DigestsAttachment is data as an encoded digest table of the memory
// file. Check validates it against the record.
func DigestsAttachment(data []byte) Attachment {
	d := DescribeDigests(data)
	return Attachment{Name: DigestsFileName, Data: data, digests: &d}
}

// ManifestDescriptor is the descriptor of a manifest attachment.
func (a Attachment) ManifestDescriptor() ManifestDescriptor {
	if a.manifest == nil {
		return ManifestDescriptor{}
	}
	return *a.manifest
}

// DigestsDescriptor is the descriptor of a digest table attachment.
func (a Attachment) DigestsDescriptor() DigestsDescriptor {
	if a.digests == nil {
		return DigestsDescriptor{}
	}
	return *a.digests
}

// Check validates the bytes against the record they are attached to, read
// under the record lock: a digest table must decode as the table of a
// file of rec.MemorySize bytes (ErrInvalidRequest otherwise).
func (a Attachment) Check(rec Record) error {
	if a.digests == nil {
		return nil
	}
	if _, err := integrity.Decode(a.Data, rec.MemorySize); err != nil {
		return fmt.Errorf("%w: digest table: %w", ErrInvalidRequest, err)
	}
	return nil
}

// DescribedBy reports whether rec has a descriptor of this artifact, and
// whether it is the descriptor of these bytes. A backend drops a
// descriptor of other bytes (Cleared) before it replaces the stored file,
// so that a crash in between never pairs a descriptor with other bytes.
func (a Attachment) DescribedBy(rec Record) (has, same bool) {
	switch {
	case a.manifest != nil && rec.Manifest != nil:
		return true, *rec.Manifest == *a.manifest
	case a.digests != nil && rec.MemoryDigests != nil:
		return true, *rec.MemoryDigests == *a.digests
	}
	return false, false
}

// Cleared returns rec without a descriptor of this artifact.
func (a Attachment) Cleared(rec Record) Record {
	if a.manifest != nil {
		// A startup pack is built from one manifest, and a recording
		// describes one: they go with it.
		rec.Manifest = nil
		rec.StartupPack = nil
		rec.ManifestRecording = nil
	}
	if a.digests != nil {
		rec.MemoryDigests = nil
	}
	return rec
}

// Attached returns rec describing these bytes.
func (a Attachment) Attached(rec Record) Record {
	if a.manifest != nil {
		d := *a.manifest
		rec.Manifest = &d
		rec.ManifestRecording = a.recording
		if rec.StartupPack != nil && rec.StartupPack.ManifestSHA256 != d.SHA256 {
			rec.StartupPack = nil
		}
	}
	if a.digests != nil {
		d := *a.digests
		rec.MemoryDigests = &d
	}
	return rec
}
