package repository

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error a Repository returns for one of these cases
// wraps the sentinel, so callers test with errors.Is.
var (
	// ErrNotFound: no visible snapshot has that id or alias.
	ErrNotFound = errors.New("not found")
	// ErrAliasConflict: the alias is bound to another snapshot.
	ErrAliasConflict = errors.New("alias conflict")
	// ErrIntegrity: stored bytes or metadata do not match what was written.
	ErrIntegrity = errors.New("integrity mismatch")
	// ErrInvalidRequest: the caller asked for something that can never
	// succeed as asked (bad id, bad alias, bad layout, foreign lease).
	ErrInvalidRequest = errors.New("invalid request")
	// ErrLeaseEnded: the capture lease was ended before the operation.
	ErrLeaseEnded = errors.New("capture lease ended")
	// ErrStale: the record changed since the caller read what it built
	// on (AttachRefinement); read again and redo.
	ErrStale = errors.New("record changed since it was read")
	// ErrUnreachable: the store did not answer (connection refused or
	// reset, no response within the timeout, a response that stopped
	// coming). The same request may succeed later; a store that answers
	// with an error (denied, not found, a bad object) is not unreachable.
	ErrUnreachable = errors.New("the store is unreachable")
)

// FieldError is an error (wrapping ErrInvalidRequest) that one field of
// a publish request caused, named as an import request names it (the
// Field constants), so that a caller can say which value to change.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// The fields a FieldError names: a publish request's alias, vm state and
// memory files, layout and link.
const (
	FieldAlias   = "alias"
	FieldVMState = "vm_state"
	FieldMemory  = "memory"
	FieldLayout  = "layout"
	FieldLink    = "link"
)

// AliasConflictError reports which snapshot holds the alias. It matches
// ErrAliasConflict with errors.Is.
type AliasConflictError struct {
	Alias string
	// HolderID is the snapshot the alias is bound to.
	HolderID string
}

func (e *AliasConflictError) Error() string {
	return fmt.Sprintf("alias %q is bound to snapshot %s: %v", e.Alias, e.HolderID, ErrAliasConflict)
}

// Is makes errors.Is(err, ErrAliasConflict) true.
func (e *AliasConflictError) Is(target error) bool { return target == ErrAliasConflict }

// IntegrityError reports an artifact whose stored bytes differ from the
// bytes that were written. It matches ErrIntegrity with errors.Is.
type IntegrityError struct {
	// Artifact is the file name within the snapshot (e.g. MemoryFileName).
	Artifact string
	// Want and Got are lowercase hex SHA-256 digests, or sizes in decimal
	// when the sizes already differ.
	Want, Got string
}

func (e *IntegrityError) Error() string {
	return fmt.Sprintf("%s: want %s, stored %s: %v", e.Artifact, e.Want, e.Got, ErrIntegrity)
}

// Is makes errors.Is(err, ErrIntegrity) true.
func (e *IntegrityError) Is(target error) bool { return target == ErrIntegrity }

// DanglingAliasError is the error of resolving an alias whose binding
// names a snapshot that is not there to resolve to (missing: deleted, or
// its publish never finished; or one that does not carry the alias). It
// names both, so an operator sees which id went missing, and matches
// ErrNotFound: the alias names no visible snapshot, and the next
// publisher of the alias takes the binding over. errors.As finds it as a
// *DanglingAlias.
func DanglingAliasError(alias, id, why string) error {
	return &DanglingAlias{Alias: alias, ID: id, Why: why}
}

// DanglingAlias is a DanglingAliasError: Alias is bound to ID, which Why
// (DanglingMissing or DanglingNotCarried). Delete releases a missing
// one; verify reports one whose record carries another alias as damage
// rather than as "not found".
type DanglingAlias struct {
	Alias, ID, Why string
}

func (e *DanglingAlias) Error() string {
	return fmt.Sprintf("alias %s names snapshot %s, which %s: %v", e.Alias, e.ID, e.Why, ErrNotFound)
}

// Is makes errors.Is(err, ErrNotFound) true.
func (e *DanglingAlias) Is(target error) bool { return target == ErrNotFound }

// Why an alias dangles, for DanglingAliasError.
const (
	DanglingMissing    = "does not exist (deleted, or its publish did not finish)"
	DanglingNotCarried = "does not carry the alias"
)
