package repository

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"warmstart/internal/untrusted"
)

// A refinement is the learned startup manifest of a snapshot (package
// refine): the refined manifest a restore prefetches and the state it was
// learned from, stored as one file so that both are replaced at once.
// Its name carries the file's SHA-256, so a new refinement never
// overwrites the one the record describes: a crash leaves the old pair or
// the new one, never a mix, and the file the record names is immutable.
//
// The file, little-endian:
//
//	magic          8 bytes "WSREFINE"
//	manifest size  uint64  M
//	manifest       M bytes, a v1 startup manifest
//	state          the rest, refine's encoding
const (
	refinementFilePrefix = "startup-refinement-"
	refinementFileSuffix = ".bin"
	refinementHeaderSize = 16
	// MaxRefinementBytes caps a refinement file: a manifest of at most
	// MaxManifestBytes and the state of at most as many pages as such a
	// manifest holds, 24 bytes each.
	MaxRefinementBytes = 48 << 20
)

var refinementMagic = [8]byte{'W', 'S', 'R', 'E', 'F', 'I', 'N', 'E'}

// ErrRefinementCorrupt is wrapped by every error reading a refinement file
// that is not what its descriptor says.
var ErrRefinementCorrupt = errors.New("refinement file corrupt")

// RefinementDescriptor identifies the attached refinement of a snapshot.
type RefinementDescriptor struct {
	// SHA256 and Size are those of the whole refinement file.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	// ManifestSHA256 and ManifestSize are those of the refined manifest
	// inside it: its digest is the prefetch key of restores that use it.
	ManifestSHA256 string `json:"manifest_sha256"`
	ManifestSize   int64  `json:"manifest_size"`
	// BaseSHA256 is the recorded manifest the refinement grew from.
	BaseSHA256 string `json:"base_sha256"`
	// Restores counts the restores learned from.
	Restores uint64 `json:"restores"`
	// Pages is the refined manifest's page count (4 KiB pages).
	Pages int64 `json:"pages"`
}

// Refinement is what AttachRefinement stores.
type Refinement struct {
	// BaseSHA256 is the digest of the recorded manifest it grew from; the
	// attach is refused (ErrStale) when the record's manifest is another.
	BaseSHA256 string
	// PreviousSHA256 is the refinement file it was learned on top of, ""
	// when it grew from the recorded manifest alone. The attach is
	// refused (ErrStale) when the record describes another by then: two
	// learners (processes) that read the same refinement cannot both
	// replace it, so neither restore's lesson is lost silently.
	PreviousSHA256 string
	Restores       uint64
	Pages          int64
	// Manifest is the encoded refined manifest, State the encoded state.
	Manifest []byte
	State    []byte
}

// RefinementFileName is the file name of a refinement file with this
// SHA-256.
func RefinementFileName(sha string) string {
	return refinementFilePrefix + sha + refinementFileSuffix
}

// IsRefinementFile reports whether name is a refinement file's.
func IsRefinementFile(name string) bool {
	return strings.HasPrefix(name, refinementFilePrefix) && strings.HasSuffix(name, refinementFileSuffix)
}

// RefinementAttachment is r as an attachment (ErrInvalidRequest when its
// parts are empty or too large).
func RefinementAttachment(r Refinement) (Attachment, error) {
	switch {
	case len(r.Manifest) == 0 || len(r.Manifest) > MaxManifestBytes:
		return Attachment{}, fmt.Errorf("%w: refined manifest of %d bytes is outside 1..%d", ErrInvalidRequest, len(r.Manifest), MaxManifestBytes)
	case refinementHeaderSize+len(r.Manifest)+len(r.State) > MaxRefinementBytes:
		return Attachment{}, fmt.Errorf("%w: refinement of %d bytes is over %d", ErrInvalidRequest, len(r.Manifest)+len(r.State), MaxRefinementBytes)
	case len(r.BaseSHA256) != 64:
		return Attachment{}, fmt.Errorf("%w: refinement base %q is not a SHA-256", ErrInvalidRequest, r.BaseSHA256)
	}
	data := make([]byte, 0, refinementHeaderSize+len(r.Manifest)+len(r.State))
	data = append(data, refinementMagic[:]...)
	data = binary.LittleEndian.AppendUint64(data, uint64(len(r.Manifest)))
	data = append(append(data, r.Manifest...), r.State...)
	sum, msum := sha256.Sum256(data), sha256.Sum256(r.Manifest)
	d := RefinementDescriptor{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data)),
		ManifestSHA256: hex.EncodeToString(msum[:]), ManifestSize: int64(len(r.Manifest)),
		BaseSHA256: strings.ToLower(r.BaseSHA256), Restores: r.Restores, Pages: r.Pages}
	return Attachment{Name: RefinementFileName(d.SHA256), Data: data, refinement: &d, previous: r.PreviousSHA256}, nil
}

// RefinedManifest is the refined manifest inside a refinement
// attachment's data, nil when a is not a refinement: what a backend that
// packs the startup set for remote nodes packs.
func (a Attachment) RefinedManifest() []byte {
	d := a.refinement
	if d == nil || int64(len(a.Data)) < refinementHeaderSize+d.ManifestSize {
		return nil
	}
	return a.Data[refinementHeaderSize : refinementHeaderSize+d.ManifestSize]
}

// ReadRefinedManifest reads only the refined manifest out of the
// refinement file at path: what a restore needs, without hashing the
// state. The caller verifies the bytes against d.ManifestSHA256.
func ReadRefinedManifest(path string, d RefinementDescriptor) ([]byte, error) {
	f, err := untrusted.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if d.ManifestSize <= 0 || d.ManifestSize > MaxManifestBytes {
		return nil, fmt.Errorf("%s: %w: descriptor says a manifest of %d bytes", path, ErrRefinementCorrupt, d.ManifestSize)
	}
	head := make([]byte, refinementHeaderSize)
	if _, err := io.ReadFull(f, head); err != nil {
		return nil, fmt.Errorf("%s: %w: header: %w", path, ErrRefinementCorrupt, err)
	}
	if err := checkRefinementHeader(head, d.ManifestSize); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	data := make([]byte, d.ManifestSize)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("%s: %w: manifest: %w", path, ErrRefinementCorrupt, err)
	}
	return data, nil
}

// ReadRefinement reads the whole refinement file at path, checks it
// against d and returns its refined manifest and state.
func ReadRefinement(path string, d RefinementDescriptor) (manifest, state []byte, err error) {
	data, err := untrusted.ReadBounded(path, MaxRefinementBytes)
	if err != nil {
		return nil, nil, err
	}
	sum := sha256.Sum256(data)
	switch {
	case int64(len(data)) != d.Size:
		return nil, nil, fmt.Errorf("%s: %w: %d bytes, descriptor says %d", path, ErrRefinementCorrupt, len(data), d.Size)
	case hex.EncodeToString(sum[:]) != d.SHA256:
		return nil, nil, fmt.Errorf("%s: %w: sha256 differs from the descriptor's", path, ErrRefinementCorrupt)
	case len(data) < refinementHeaderSize:
		return nil, nil, fmt.Errorf("%s: %w: no header", path, ErrRefinementCorrupt)
	}
	if err := checkRefinementHeader(data[:refinementHeaderSize], d.ManifestSize); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	body := data[refinementHeaderSize:]
	if int64(len(body)) < d.ManifestSize {
		return nil, nil, fmt.Errorf("%s: %w: shorter than its manifest", path, ErrRefinementCorrupt)
	}
	return body[:d.ManifestSize], body[d.ManifestSize:], nil
}

func checkRefinementHeader(head []byte, manifestSize int64) error {
	if [8]byte(head[:8]) != refinementMagic {
		return fmt.Errorf("%w: bad magic number", ErrRefinementCorrupt)
	}
	if n := binary.LittleEndian.Uint64(head[8:]); n != uint64(manifestSize) {
		return fmt.Errorf("%w: manifest of %d bytes, descriptor says %d", ErrRefinementCorrupt, n, manifestSize)
	}
	return nil
}
