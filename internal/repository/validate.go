package repository

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/google/uuid"

	"warmstart/internal/integrity"
	"warmstart/internal/untrusted"
)

// MaxAliasBytes is the longest alias accepted.
const MaxAliasBytes = 128

// NewID returns a fresh snapshot id: a UUIDv7, so ids sort by creation time.
func NewID() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("new snapshot id: %w", err)
	}
	return u.String(), nil
}

// ValidateID accepts only canonical lowercase UUIDv7 strings. Backends turn
// ids into paths and object keys, so anything else (other UUID spellings,
// "..", "/", NUL, the empty string) is refused here, before it can name a
// file.
func ValidateID(id string) error {
	u, err := uuid.Parse(id)
	if err != nil || u.String() != id {
		return fmt.Errorf("%w: snapshot id %q is not a canonical UUID", ErrInvalidRequest, id)
	}
	if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		return fmt.Errorf("%w: snapshot id %q is not a UUIDv7", ErrInvalidRequest, id)
	}
	return nil
}

// ValidateAlias accepts 1..128 characters of [A-Za-z0-9_-] that do not parse
// as a UUID; the last rule keeps Lookup's "id if it parses as a UUID, else
// alias" unambiguous.
func ValidateAlias(alias string) error {
	if alias == "" || len(alias) > MaxAliasBytes {
		return fmt.Errorf("%w: alias %q must be 1 to %d characters", ErrInvalidRequest, alias, MaxAliasBytes)
	}
	if !aliasAlphabet(alias) {
		return fmt.Errorf("%w: alias %q may hold only A-Z, a-z, 0-9, '_' and '-'", ErrInvalidRequest, alias)
	}
	if _, err := uuid.Parse(alias); err == nil {
		return fmt.Errorf("%w: alias %q looks like a snapshot id", ErrInvalidRequest, alias)
	}
	return nil
}

// ValidateNewAlias is ValidateAlias for an alias about to be bound: it
// also refuses one that starts with '-', which a command line reads as a
// flag, so it could only be passed after "--". Aliases bound before this
// rule stay valid for ValidateAlias, which reading and looking up use, so
// they still list, resolve and delete.
func ValidateNewAlias(alias string) error {
	if err := ValidateAlias(alias); err != nil {
		return err
	}
	if alias[0] == '-' {
		return fmt.Errorf("%w: alias %q must not start with '-': a command line would read it as a flag", ErrInvalidRequest, alias)
	}
	return nil
}

// ValidateFilter checks the parts of a Filter that have a syntax.
func ValidateFilter(f Filter) error {
	if len(f.AliasPrefix) > MaxAliasBytes || !aliasAlphabet(f.AliasPrefix) {
		return fmt.Errorf("%w: alias prefix %q is not made of alias characters", ErrInvalidRequest, f.AliasPrefix)
	}
	return nil
}

// ValidateRef accepts what Lookup can look up: an id (ValidateID) when ref
// parses as a UUID in any spelling, else an alias (ValidateAlias). A
// caller checks it before it opens anything, so that a malformed name is
// refused as such and never as a lookup that found nothing.
func ValidateRef(ref string) error {
	if RefIsID(ref) {
		return ValidateID(ref)
	}
	return ValidateAlias(ref)
}

// RefIsID reports whether Lookup treats ref as an id (it parses as a UUID in
// any spelling) rather than as an alias.
func RefIsID(ref string) bool {
	_, err := uuid.Parse(ref)
	return err == nil
}

func aliasAlphabet(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Validate checks a record read back from storage: a record that fails here
// is reported as ErrIntegrity by Get and never listed.
func (r Record) Validate() error {
	for _, check := range []func() error{r.validateCore, r.validateManifest, r.validateDigests, r.validateLayered, r.validateStorage} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateCore checks the record's identity, layout and artifacts.
func (r Record) validateCore() error {
	switch {
	case r.Format < 1 || r.Format > RecordFormatLayered:
		return fmt.Errorf("%w: record format %d is not supported (this build reads 1..%d)", ErrIntegrity, r.Format, RecordFormatLayered)
	case ValidateID(r.ID) != nil:
		return fmt.Errorf("%w: record id %q is not a UUIDv7", ErrIntegrity, r.ID)
	case r.Alias != "" && ValidateAlias(r.Alias) != nil:
		return fmt.Errorf("%w: record alias %q is invalid", ErrIntegrity, r.Alias)
	case r.Layout.Validate() != nil:
		return fmt.Errorf("%w: record layout: %v", ErrIntegrity, r.Layout.Validate())
	case r.Layout.FileSize != r.MemorySize:
		return fmt.Errorf("%w: layout file size %d differs from memory size %d", ErrIntegrity, r.Layout.FileSize, r.MemorySize)
	case r.VMStateSize < 0 || !isSHA256Hex(r.VMStateSHA256) || (!r.Layered() && !isSHA256Hex(r.MemorySHA256)):
		return fmt.Errorf("%w: record artifact sizes or digests are malformed", ErrIntegrity)
	}
	return nil
}

// validateManifest checks the startup manifest's descriptor and how it
// was recorded.
func (r Record) validateManifest() error {
	switch {
	case r.Manifest != nil && (r.Manifest.Size <= 0 || r.Manifest.Size > MaxManifestBytes || !isSHA256Hex(r.Manifest.SHA256)):
		return fmt.Errorf("%w: record manifest descriptor is malformed", ErrIntegrity)
	case r.ManifestRecording != nil && r.Manifest == nil:
		return fmt.Errorf("%w: record has a manifest recording but no manifest", ErrIntegrity)
	case r.ManifestRecording != nil && r.ManifestRecording.Validate() != nil:
		return fmt.Errorf("%w: record manifest %v", ErrIntegrity, r.ManifestRecording.Validate())
	}
	return nil
}

// validateDigests checks the digest table descriptors.
func (r Record) validateDigests() error {
	for _, t := range []struct {
		d    *DigestsDescriptor
		alg  integrity.Algorithm
		what string
	}{{r.MemoryDigests, integrity.CRC32C, "digest table"}, {r.MemorySHA256Digests, integrity.SHA256, "SHA-256 digest table"}} {
		if t.d == nil {
			continue
		}
		if err := t.d.validateAs(t.alg, r.MemorySize); err != nil {
			return fmt.Errorf("%w: record %s descriptor: %v", ErrIntegrity, t.what, err)
		}
	}
	return nil
}

// Validate checks that d describes a table this build reads for a memory
// file of memorySize bytes.
func (d DigestsDescriptor) Validate(memorySize int64) error {
	alg := integrity.Algorithm(d.Algorithm)
	switch {
	case !alg.Known() || d.BlockBytes != integrity.BlockBytes:
		return fmt.Errorf("digest algorithm %q over %d-byte blocks is not one this build reads (%q or %q over %d)",
			d.Algorithm, d.BlockBytes, integrity.SHA256, integrity.CRC32C, integrity.BlockBytes)
	case d.Size != integrity.EncodedSize(alg, memorySize):
		return fmt.Errorf("digest table of %d bytes does not fit a %d-byte memory file", d.Size, memorySize)
	case !isSHA256Hex(d.SHA256):
		return fmt.Errorf("digest table SHA-256 %q is malformed", d.SHA256)
	}
	return nil
}

// validateAs is Validate for a table that must be of alg's digests.
func (d DigestsDescriptor) validateAs(alg integrity.Algorithm, memorySize int64) error {
	if d.Algorithm != string(alg) {
		return fmt.Errorf("a table of %q digests where one of %q belongs", d.Algorithm, alg)
	}
	return d.Validate(memorySize)
}

// DescribeDigests returns the descriptor of an encoded digest table; its
// algorithm is the one the table's header names ("" for bytes that are
// no table).
func DescribeDigests(encoded []byte) DigestsDescriptor {
	alg, _ := integrity.AlgorithmOf(encoded)
	sum := sha256.Sum256(encoded)
	return DigestsDescriptor{Algorithm: string(alg), BlockBytes: integrity.BlockBytes,
		SHA256: hex.EncodeToString(sum[:]), Size: int64(len(encoded))}
}

// isSHA256Hex reports whether s is a lowercase hex SHA-256 digest.
func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// PublishSizes are the sizes of a publish request's files.
type PublishSizes struct {
	VMState, Memory int64
}

// CheckPublish validates what every backend validates before importing:
// the alias, that both files are regular files, and that the layout is
// valid and describes a memory file of exactly the memory file's size.
// Each error is a *FieldError naming the request field at fault.
func CheckPublish(req PublishRequest) (PublishSizes, error) {
	if req.Alias != "" {
		if err := ValidateNewAlias(req.Alias); err != nil {
			return PublishSizes{}, &FieldError{Field: FieldAlias, Err: err}
		}
	}
	vmSize, err := regularFileSize(req.VMStatePath, "vm state")
	if err != nil {
		return PublishSizes{}, &FieldError{Field: FieldVMState, Err: err}
	}
	if vmSize == 0 {
		// No VMM writes an empty state; restoring one fails only later.
		return PublishSizes{}, &FieldError{Field: FieldVMState, Err: fmt.Errorf("%w: vm state file %s is empty", ErrInvalidRequest, req.VMStatePath)}
	}
	memSize, err := regularFileSize(req.MemoryPath, "memory")
	if err != nil {
		return PublishSizes{}, &FieldError{Field: FieldMemory, Err: err}
	}
	if err := req.Layout.ValidateNew(); err != nil {
		return PublishSizes{}, &FieldError{Field: FieldLayout, Err: fmt.Errorf("%w: %w", ErrInvalidRequest, err)}
	}
	if req.Layout.FileSize != memSize {
		// The layout was made for the file's size: the file is what changed.
		return PublishSizes{}, &FieldError{Field: FieldMemory, Err: fmt.Errorf("%w: layout is for a %d-byte memory file but %s has %d bytes",
			ErrInvalidRequest, req.Layout.FileSize, req.MemoryPath, memSize)}
	}
	return PublishSizes{VMState: vmSize, Memory: memSize}, nil
}

func regularFileSize(path, what string) (int64, error) {
	if path == "" {
		return 0, fmt.Errorf("%w: no %s file given", ErrInvalidRequest, what)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0, fmt.Errorf("%w: %s file: %w", ErrInvalidRequest, what, err)
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("%w: %s file %s is not a regular file", ErrInvalidRequest, what, path)
	}
	if err := untrusted.CheckOnDisk(path); err != nil {
		return 0, fmt.Errorf("%w: %s file: %w", ErrInvalidRequest, what, err)
	}
	return fi.Size(), nil
}
