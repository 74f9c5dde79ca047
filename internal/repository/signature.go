package repository

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Signed records. A record may carry Ed25519 signatures (Record.Signatures),
// each over its core: what the snapshot is and which bytes make it, as
// the publisher stored them. The core is everything a restore serves
// bytes by: the ids, the layout, every artifact's size and SHA-256, the
// digest table's descriptor (which names every 4 KiB block's SHA-256),
// the chunk map's descriptor and the memory format. What nodes attach
// later is outside it (the startup manifest, its recording, the
// refinement, the startup packs): those only choose which ranges of the
// memory a restore prefetches, and every byte a prefetch reads is
// checked against the signed digest table like any other, so an
// attachment nobody signed can slow a restore down but cannot put a byte
// into a guest. Which keys a node trusts is package trust's business; a
// signature carries its public key so anyone can check it, and only the
// node's own list decides whether that key counts.

// CoreVersion is the version of the core encoding (SignedCore) of a
// plain record; CoreVersionLayered that of a record of
// RecordFormatLayered, which adds its parent and every memory layer's
// descriptor (owner, name, kind, size, SHA-256, format, chunk map, page
// map and both tables), so one signature pins every byte of every
// ancestor layer the record reads. Plain records keep version 1, so
// their signatures stay valid.
const (
	CoreVersion        = 1
	CoreVersionLayered = 2
)

// coreVersionOf is the core version rec is signed with.
func coreVersionOf(rec Record) int {
	if rec.Format >= RecordFormatLayered {
		return CoreVersionLayered
	}
	return CoreVersion
}

// SignatureAlgorithm is the signature scheme: Ed25519 (RFC 8032), pure,
// over the core's bytes.
const SignatureAlgorithm = "ed25519"

// coreHeader starts the core encoding; it names what is signed, so that
// a signature over one never passes for a signature of anything else.
const (
	coreHeader        = "warmstart snapshot record core v1\n"
	coreHeaderLayered = "warmstart snapshot record core v2\n"
)

// Signature is one signature of a record's core.
type Signature struct {
	// KeyID names the signing key (KeyID of PublicKey).
	KeyID string `json:"key_id"`
	// Algorithm is SignatureAlgorithm.
	Algorithm string `json:"algorithm"`
	// Core is the version of the core encoding signed (CoreVersion).
	Core int `json:"core"`
	// PublicKey is the signer's Ed25519 public key (32 bytes; base64 in
	// JSON).
	PublicKey []byte `json:"public_key"`
	// Value is the signature (64 bytes; base64 in JSON).
	Value []byte `json:"signature"`
}

// Errors of signatures. ErrBadSignature is what a signature that does
// not verify over the record it is in wraps; ErrUnsignable what a record
// that no signature can vouch for wraps.
var (
	ErrBadSignature = errors.New("signature does not verify over the record")
	ErrUnsignable   = errors.New("record cannot be signed")
)

// KeyID names an Ed25519 public key: the first 8 bytes of the SHA-256 of
// its 32 bytes, in hex (16 characters).
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// SignedCore is the canonical encoding of rec's core, the bytes a
// signature signs: a header line, then one "name value" line per part,
// in this order, each ending in "\n", values separated by one space:
//
//	warmstart snapshot record core v1
//	id <id>
//	alias <alias, empty when none>
//	created_at <RFC 3339 UTC, nanoseconds as needed>
//	format <record format>
//	layout <memory file size> <offset:size:page size,...>
//	vm_state <size> <sha256>
//	memory <size> <sha256> <memory format>
//	memory_digests <algorithm> <block bytes> <size> <sha256>         ("memory_digests -" when none)
//	memory_sha256_digests <algorithm> <block bytes> <size> <sha256>
//	memory_chunks <size> <sha256> <chunk bytes>                      ("memory_chunks -" when not chunked)
//
// Every value is from a fixed alphabet without spaces or newlines (the
// record validates so), so the encoding is unambiguous. A record without
// a part the core must name, among them the table of SHA-256 digests
// (without it nothing ties each block to the signature past a CRC a
// writer can keep), cannot be signed: ErrUnsignable says which.
func SignedCore(rec Record) ([]byte, error) {
	if err := signable(rec); err != nil {
		return nil, err
	}
	var b strings.Builder
	if coreVersionOf(rec) == CoreVersionLayered {
		b.WriteString(coreHeaderLayered)
	} else {
		b.WriteString(coreHeader)
	}
	line := func(name string, values ...any) {
		b.WriteString(name)
		for _, v := range values {
			fmt.Fprintf(&b, " %v", v)
		}
		b.WriteByte('\n')
	}
	line("id", rec.ID)
	line("alias", rec.Alias)
	line("created_at", rec.CreatedAt.UTC().Format(time.RFC3339Nano))
	line("format", rec.Format)
	line("layout", rec.Layout.FileSize, rec.Layout.String())
	line("vm_state", rec.VMStateSize, rec.VMStateSHA256)
	line("memory", rec.MemorySize, orDash(rec.MemorySHA256), rec.MemoryFormat)
	for _, t := range []struct {
		name string
		d    *DigestsDescriptor
	}{{"memory_digests", rec.MemoryDigests}, {"memory_sha256_digests", rec.MemorySHA256Digests}} {
		if t.d == nil {
			line(t.name, "-")
		} else {
			line(t.name, t.d.Algorithm, t.d.BlockBytes, t.d.Size, t.d.SHA256)
		}
	}
	if c := rec.MemoryChunks; c != nil {
		line("memory_chunks", c.Size, c.SHA256, c.ChunkBytes)
	} else {
		line("memory_chunks", "-")
	}
	if coreVersionOf(rec) == CoreVersionLayered {
		writeLayeredCore(&b, rec)
	}
	return []byte(b.String()), nil
}

// signable says why rec's core cannot be signed, or nil.
func signable(rec Record) error {
	if err := rec.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrUnsignable, err)
	}
	if rec.Layered() {
		return nil // validateLayered: every layer has both tables
	}
	switch {
	case rec.MemorySHA256Digests == nil:
		return fmt.Errorf("%w: it has no table of SHA-256 digests, so nothing ties its memory's blocks to a signature "+
			"(`warmstart snapshot verify --add-digests` adds one)", ErrUnsignable)
	case rec.MemoryFormat == "":
		return fmt.Errorf("%w: it names no memory format", ErrUnsignable)
	case rec.MemoryFormat == MemoryFormatChunks && rec.MemoryChunks == nil:
		return fmt.Errorf("%w: its chunked memory has no chunk map descriptor", ErrUnsignable)
	}
	return nil
}

// Sign returns the signature of rec's core by key.
func Sign(rec Record, key ed25519.PrivateKey) (Signature, error) {
	core, err := SignedCore(rec)
	if err != nil {
		return Signature{}, err
	}
	pub := key.Public().(ed25519.PublicKey)
	return Signature{KeyID: KeyID(pub), Algorithm: SignatureAlgorithm, Core: coreVersionOf(rec),
		PublicKey: slices.Clone(pub), Value: ed25519.Sign(key, core)}, nil
}

// WellFormed checks what can be checked of s without a record: its
// algorithm, core version, key and signature lengths, and that KeyID
// names its key.
func (s Signature) WellFormed() error {
	switch {
	case s.Algorithm != SignatureAlgorithm:
		return fmt.Errorf("%w: algorithm %q (this build checks %q)", ErrBadSignature, s.Algorithm, SignatureAlgorithm)
	case s.Core != CoreVersion && s.Core != CoreVersionLayered:
		return fmt.Errorf("%w: core encoding version %d (this build checks %d and %d)", ErrBadSignature, s.Core, CoreVersion, CoreVersionLayered)
	case len(s.PublicKey) != ed25519.PublicKeySize || len(s.Value) != ed25519.SignatureSize:
		return fmt.Errorf("%w: a %d-byte key and a %d-byte signature (Ed25519 has %d and %d)",
			ErrBadSignature, len(s.PublicKey), len(s.Value), ed25519.PublicKeySize, ed25519.SignatureSize)
	case s.KeyID != KeyID(s.PublicKey):
		return fmt.Errorf("%w: key id %q does not name its key (%s)", ErrBadSignature, s.KeyID, KeyID(s.PublicKey))
	}
	return nil
}

// Verify checks s over rec's core with the key s carries: nil when it
// verifies. It says nothing of whether the key is to be trusted.
func (s Signature) Verify(rec Record) error {
	if err := s.WellFormed(); err != nil {
		return err
	}
	if want := coreVersionOf(rec); s.Core != want {
		return fmt.Errorf("%w: key %s signed core version %d, a record of format %d has %d", ErrBadSignature, s.KeyID, s.Core, rec.Format, want)
	}
	core, err := SignedCore(rec)
	if err != nil {
		return err
	}
	if !ed25519.Verify(s.PublicKey, core, s.Value) {
		return fmt.Errorf("%w: key %s signed other contents (the record changed after it was signed)", ErrBadSignature, s.KeyID)
	}
	return nil
}

// WithSignature returns the signatures of sigs with s added, replacing
// one by the same key.
func WithSignature(sigs []Signature, s Signature) []Signature {
	out := slices.DeleteFunc(slices.Clone(sigs), func(o Signature) bool { return o.KeyID == s.KeyID })
	return append(out, s)
}

// SignRecord returns rec carrying key's signature, as a publish commits
// it; a nil key returns rec as it is.
func SignRecord(rec Record, key ed25519.PrivateKey) (Record, error) {
	if key == nil {
		return rec, nil
	}
	s, err := Sign(rec, key)
	if err != nil {
		return Record{}, fmt.Errorf("sign record %s: %w", rec.ID, err)
	}
	rec.Signatures = WithSignature(rec.Signatures, s)
	return rec, nil
}

// validSignatures returns those of rec's signatures that still verify
// over it.
func validSignatures(rec Record) []Signature {
	var out []Signature
	for _, s := range rec.Signatures {
		if s.Verify(rec) == nil {
			out = append(out, s)
		}
	}
	return out
}

// orDash is s, or "-" for an empty s (a field a layered record leaves
// empty), so every core line has its fields.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
