package repository

import (
	"errors"
	"fmt"
	"sync"
)

// The lease protocol within one process, which every backend shares: a
// lease is held from BeginCapture or LeaseExisting until End; operations
// under it (Publish, AttachManifest, AttachDigests) run only while it is
// held, and End waits for those in flight and lets none start after it.
// What a lease means beyond the process (a flock in posixfs, nothing but
// the conditional writes in s3) is the backend's, given to NewHeldLease as
// the release to run at End.

// HeldLease is a Lease as the backends issue it.
type HeldLease struct {
	issuer  any
	id      string
	release func()

	// mu is read-held by every operation that acts under the lease and
	// write-held by End, so End waits for them and none starts after it.
	mu    sync.RWMutex
	ended bool
	done  chan struct{}
}

var _ Lease = (*HeldLease)(nil)

// NewHeldLease returns a lease on snapshot id issued by issuer (the
// backend's repository; OwnLease accepts the lease only from it). End
// runs release once, after the last operation under the lease.
func NewHeldLease(issuer any, id string, release func()) *HeldLease {
	return &HeldLease{issuer: issuer, id: id, release: release, done: make(chan struct{})}
}

// SnapshotID implements Lease.
func (l *HeldLease) SnapshotID() string { return l.id }

// Done implements Lease.
func (l *HeldLease) Done() <-chan struct{} { return l.done }

// End implements Lease.
func (l *HeldLease) End() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return nil
	}
	l.ended = true
	close(l.done)
	l.release()
	return nil
}

// do runs op on the lease's snapshot while the lease is held, so that End
// waits for it; once the lease has ended it fails with ErrLeaseEnded.
func (l *HeldLease) do(op func(id string) error) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.ended {
		return fmt.Errorf("snapshot %s: %w", l.id, ErrLeaseEnded)
	}
	return op(l.id)
}

// OwnLease returns the HeldLease behind lz if issuer issued it, and
// ErrInvalidRequest otherwise.
func OwnLease(issuer any, lz Lease) (*HeldLease, error) {
	own, ok := lz.(*HeldLease)
	if !ok || own == nil || own.issuer != issuer {
		return nil, fmt.Errorf("%w: the lease was not issued by this repository", ErrInvalidRequest)
	}
	return own, nil
}

// PublishUnderLease is Publish for a backend that issues HeldLeases:
// publish runs on the lease's snapshot id while the lease is held.
func PublishUnderLease(issuer any, lz Lease, publish func(id string) (Record, error)) (Record, error) {
	l, err := OwnLease(issuer, lz)
	if err != nil {
		return Record{}, fmt.Errorf("publish: %w", err)
	}
	var rec Record
	var opErr error
	err = l.do(func(id string) error {
		rec, opErr = publish(id)
		return opErr
	})
	switch {
	case errors.Is(opErr, ErrInvalidRequest):
		// Refused before anything was created: the id names nothing.
		return Record{}, fmt.Errorf("publish: %w", opErr)
	case opErr != nil:
		return Record{}, fmt.Errorf("publish %s: %w", l.id, opErr)
	case err != nil:
		return Record{}, fmt.Errorf("publish: %w", err)
	}
	return rec, nil
}

// Attacher stores attachment a on snapshot id: the backend's half of
// AttachManifest and AttachDigests.
type Attacher func(id string, a Attachment) error

// AttachManifestUnderLease is AttachManifest for a backend that issues
// HeldLeases: attach runs with data (recorded as rec says) as a manifest
// attachment while the lease is held.
func AttachManifestUnderLease(issuer any, lz Lease, data []byte, rec *Recording, attach Attacher) (ManifestDescriptor, error) {
	a, err := attachUnderLease(issuer, lz, "attach manifest", func() (Attachment, error) { return ManifestAttachment(data, rec) }, attach)
	return a.ManifestDescriptor(), err
}

// AttachDigestsUnderLease is AttachDigests for a backend that issues
// HeldLeases: attach runs with data as a digest table attachment while
// the lease is held.
func AttachDigestsUnderLease(issuer any, lz Lease, data []byte, attach Attacher) (DigestsDescriptor, error) {
	a, err := attachUnderLease(issuer, lz, "attach digest table", func() (Attachment, error) { return DigestsAttachment(data), nil }, attach)
	return a.DigestsDescriptor(), err
}

// AttachRefinementUnderLease is AttachRefinement for a backend that
// issues HeldLeases.
func AttachRefinementUnderLease(issuer any, lz Lease, r Refinement, attach Attacher) (RefinementDescriptor, error) {
	a, err := attachUnderLease(issuer, lz, "attach refinement", func() (Attachment, error) { return RefinementAttachment(r) }, attach)
	return a.RefinementDescriptor(), err
}

// AttachSignatureUnderLease is AttachSignature for a backend that issues
// HeldLeases.
func AttachSignatureUnderLease(issuer any, lz Lease, s Signature, attach Attacher) error {
	_, err := attachUnderLease(issuer, lz, "attach signature", func() (Attachment, error) { return SignatureAttachment(s) }, attach)
	return err
}

// attachUnderLease makes the attachment (refusing bad data before the
// lease is used) and attaches it under the lease; what names the
// operation in errors.
func attachUnderLease(issuer any, lz Lease, what string, attachment func() (Attachment, error), attach Attacher) (Attachment, error) {
	l, err := OwnLease(issuer, lz)
	if err != nil {
		return Attachment{}, fmt.Errorf("%s: %w", what, err)
	}
	a, err := attachment()
	if err == nil {
		err = l.do(func(id string) error { return attach(id, a) })
	}
	if err != nil {
		return Attachment{}, fmt.Errorf("%s %s: %w", what, l.id, err)
	}
	return a, nil
}
