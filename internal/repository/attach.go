package repository

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"warmstart/internal/integrity"
)

// Attachment is an artifact added to a published snapshot after publish,
// as a backend stores it: the startup manifest (AttachManifest), the
// memory file's digest table (AttachDigests), the learned manifest
// (AttachRefinement) or a signature (AttachSignature, which has no file:
// Name is ""). All are attached the same way, under the same
// guarantees, so backends run one code path for them and ask the
// Attachment what differs: the file name, how the bytes are validated
// against the record, which descriptor of the record describes them, and
// which file the new record no longer names.
type Attachment struct {
	// Name is the artifact's file name (ManifestFileName or
	// DigestsFileName).
	Name string
	// Data is what is stored.
	Data []byte

	manifest   *ManifestDescriptor
	recording  *Recording
	digests    *DigestsDescriptor
	refinement *RefinementDescriptor
	signature  *Signature
	// previous is the refinement file a refinement replaces ("" none).
	previous string
}

// SignatureAttachment is s, to be added to a record: it must be well
// formed (ErrInvalidRequest). Check verifies it over the record.
func SignatureAttachment(s Signature) (Attachment, error) {
	if err := s.WellFormed(); err != nil {
		return Attachment{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return Attachment{signature: &s}, nil
}

// HasFile reports whether the attachment stores a file (all but a
// signature, which lives in the record).
func (a Attachment) HasFile() bool { return a.Name != "" }

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
		rec = &Recording{Runs: rec.Runs, Overlap: rec.Overlap, RankCorrelation: rec.RankCorrelation, Harvested: rec.Harvested}
	}
	sum := sha256.Sum256(data)
	d := ManifestDescriptor{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
	return Attachment{Name: ManifestFileName, Data: data, manifest: &d, recording: rec}, nil
}

// DigestsAttachment is data as an encoded digest table of the memory
// file: of CRC-32C digests (DigestsFileName, Record.MemoryDigests) or
// of SHA-256 digests (SHA256DigestsFileName, Record.MemorySHA256Digests),
// as its header says. Check validates it against the record.
func DigestsAttachment(data []byte) Attachment {
	d := DescribeDigests(data)
	name := DigestsFileName
	if integrity.Algorithm(d.Algorithm) == integrity.SHA256 {
		name = SHA256DigestsFileName
	}
	return Attachment{Name: name, Data: data, digests: &d}
}

// IsDigestsFile reports whether name is a digest table's file.
func IsDigestsFile(name string) bool { return name == DigestsFileName || name == SHA256DigestsFileName }

// digestsOf is the field of rec that describes the table of alg's digests.
func digestsOf(rec *Record, alg string) **DigestsDescriptor {
	if integrity.Algorithm(alg) == integrity.SHA256 {
		return &rec.MemorySHA256Digests
	}
	return &rec.MemoryDigests
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

// RefinementDescriptor is the descriptor of a refinement attachment.
func (a Attachment) RefinementDescriptor() RefinementDescriptor {
	if a.refinement == nil {
		return RefinementDescriptor{}
	}
	return *a.refinement
}

// Check validates the bytes against the record they are attached to, read
// under the record lock: a digest table must decode as the table of a
// file of rec.MemorySize bytes (ErrInvalidRequest otherwise); a
// refinement must have grown from the record's manifest and replace the
// refinement the record describes (ErrStale otherwise).
func (a Attachment) Check(rec Record) error {
	if a.refinement != nil {
		return a.checkRefinement(rec)
	}
	if a.signature != nil {
		return checkSignature(*a.signature, rec)
	}
	if a.digests == nil {
		return nil
	}
	if _, err := integrity.Decode(a.Data, rec.MemorySize); err != nil {
		return fmt.Errorf("%w: digest table: %w", ErrInvalidRequest, err)
	}
	return nil
}

// checkSignature refuses a signature that does not verify over rec: a
// record that cannot be signed is the caller's mistake, any other
// failure means rec is not what was signed.
func checkSignature(s Signature, rec Record) error {
	err := s.Verify(rec)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrUnsignable):
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return fmt.Errorf("%w: %w", ErrStale, err)
}

func (a Attachment) checkRefinement(rec Record) error {
	if rec.Manifest == nil || rec.Manifest.SHA256 != a.refinement.BaseSHA256 {
		return fmt.Errorf("%w: refinement grew from manifest %s, which is no longer the snapshot's", ErrStale, a.refinement.BaseSHA256)
	}
	current := ""
	if rec.Refinement != nil {
		current = rec.Refinement.SHA256
	}
	if current != a.previous {
		return fmt.Errorf("%w: refinement learned on top of %q, the snapshot has %q", ErrStale, a.previous, current)
	}
	return nil
}

// DescribedBy reports whether rec has a descriptor of this artifact, and
// whether it is the descriptor of these bytes. A backend drops a
// descriptor of other bytes (Cleared) before it replaces the stored file,
// so that a crash in between never pairs a descriptor with other bytes.
//
// A refinement is never described before it is stored: its file is named
// by its SHA-256, so storing it leaves the described one alone, and the
// record switches from the old pair to the new one in one write.
func (a Attachment) DescribedBy(rec Record) (has, same bool) {
	switch {
	case a.manifest != nil && rec.Manifest != nil:
		return true, *rec.Manifest == *a.manifest
	case a.digests != nil && *digestsOf(&rec, a.digests.Algorithm) != nil:
		return true, **digestsOf(&rec, a.digests.Algorithm) == *a.digests
	}
	return false, false
}

// Cleared returns rec without a descriptor of this artifact.
func (a Attachment) Cleared(rec Record) Record {
	if a.manifest != nil {
		// A startup pack is built from one manifest, a recording describes
		// one, and a refinement grew from it: they go with it.
		rec.Manifest = nil
		rec.StartupPack = nil
		rec.ManifestRecording = nil
		rec.Refinement = nil
		rec.RefinedPack = nil
	}
	if a.digests != nil {
		*digestsOf(&rec, a.digests.Algorithm) = nil
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
		if rec.Refinement != nil && rec.Refinement.BaseSHA256 != d.SHA256 {
			rec.Refinement = nil
			rec.RefinedPack = nil
		}
	}
	if a.refinement != nil {
		d := *a.refinement
		rec.Refinement = &d
	}
	if a.digests != nil {
		d := *a.digests
		*digestsOf(&rec, d.Algorithm) = &d
		// Another table is another core: signatures of the old one
		// would say the record changed after signing. It did, on
		// purpose; the snapshot is signed anew (snapshot sign).
		rec.Signatures = validSignatures(rec)
	}
	if a.signature != nil {
		rec.Signatures = WithSignature(rec.Signatures, *a.signature)
	}
	return rec
}

// Superseded is the file of before that the record after this attach no
// longer names (a replaced or cleared refinement), "" when none. Backends
// remove it once the new record is durable; until then it is what the
// record describes.
func (a Attachment) Superseded(before Record) string {
	old := before.Refinement
	if old == nil {
		return ""
	}
	if now := a.Attached(before).Refinement; now != nil && now.SHA256 == old.SHA256 {
		return ""
	}
	return RefinementFileName(old.SHA256)
}
