// Package trust decides whether a node serves a snapshot: signing keys
// as files, and the policy of a node that trusts some of them.
//
// What is signed, by whom. A publisher with a signing key ([trust]
// signing_key) signs each record as it publishes it: the record's core
// (repository.SignedCore: ids, layout, every artifact's size and
// SHA-256, the digest table's descriptor, the chunk map's descriptor, the
// memory format), which anchors every byte a guest can read: the digest
// table names each 4 KiB block's SHA-256, and every device checks every
// block against it before serving it. What nodes attach later (the
// startup manifest and its recording, the refinement, the startup packs)
// is outside the core and signed by nobody: it only chooses which ranges
// a restore prefetches, and those are read through the same check, so
// it can slow a restore down, never change what the guest reads. A node
// that attaches one needs no key, and a record keeps its signatures
// across such attaches. `snapshot sign` adds a signature to a published
// record (another key, for rotation) once its bytes were read and found
// to match the record, or once a key the node trusts already signed it.
//
// A node with trusted keys ([trust] trusted_keys) restores a snapshot
// only when its record carries a signature that verifies, with a key of
// that list, over the record as it is (Policy.Check), before any memory
// of it is served; refusals are a *RefusedError naming the snapshot and
// why (ErrUntrusted). A node without trusted keys checks nothing, as
// before signatures existed, and says so (Status).
package trust

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"warmstart/internal/repository"
)

// ErrUntrusted is what every refusal of a snapshot by a node's trusted
// keys matches with errors.Is.
var ErrUntrusted = errors.New("not signed by a key this node trusts")

// RefusedError is a snapshot a node refused to serve: Reason says why.
type RefusedError struct {
	Snapshot string
	Reason   string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("snapshot %s refused: %s: %v", e.Snapshot, e.Reason, ErrUntrusted)
}

// Is makes errors.Is(err, ErrUntrusted) true.
func (e *RefusedError) Is(target error) bool { return target == ErrUntrusted }

// Policy is the keys a node trusts. The nil Policy, and one of no keys,
// trusts nothing and checks nothing.
type Policy struct {
	keys map[string]ed25519.PublicKey // by key id
}

// NewPolicy trusts keys.
func NewPolicy(keys ...Key) *Policy {
	p := &Policy{keys: map[string]ed25519.PublicKey{}}
	for _, k := range keys {
		p.keys[k.ID()] = k.Public
	}
	return p
}

// LoadPolicy reads the public key files of paths ([trust] trusted_keys)
// and trusts them and, when the list is not empty, own (the node's
// signing key, when it has one: a publisher restores what it signs).
func LoadPolicy(paths []string, own *Key) (*Policy, error) {
	var keys []Key
	for _, path := range paths {
		k, err := LoadPublic(path)
		if err != nil {
			return nil, err
		}
		keys = append(keys, Key{Public: k.Public})
	}
	if len(keys) > 0 && own != nil {
		keys = append(keys, Key{Public: own.Public})
	}
	return NewPolicy(keys...), nil
}

// Enforcing reports whether the policy trusts any key, and so refuses
// what none of them signed.
func (p *Policy) Enforcing() bool { return p != nil && len(p.keys) > 0 }

// KeyIDs are the ids of the trusted keys, sorted.
func (p *Policy) KeyIDs() []string {
	if p == nil {
		return nil
	}
	ids := make([]string, 0, len(p.keys))
	for id := range p.keys {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// trusts reports whether s is by a key p trusts (the same key, not only
// the same id).
func (p *Policy) trusts(s repository.Signature) bool {
	k, ok := p.keys[s.KeyID]
	return ok && bytes.Equal(k, s.PublicKey)
}

// Check returns nil when p is not enforcing, or when rec carries a
// signature by a trusted key that verifies over rec as it is; otherwise
// a *RefusedError saying why: unsigned, signed only by keys the node
// does not trust, changed after a trusted key signed it, or a record no
// signature can vouch for (a part of its core missing: a hash, the
// table of SHA-256 digests).
func (p *Policy) Check(rec repository.Record) error {
	if !p.Enforcing() {
		return nil
	}
	v := p.judge(rec)
	if v.trusted != "" {
		return nil
	}
	return &RefusedError{Snapshot: rec.ID, Reason: v.reason}
}

// verdict is what judge found.
type verdict struct {
	// trusted is the id of a trusted key whose signature verifies.
	trusted string
	// valid and invalid are the ids of the signatures that verify over
	// the record and of those that do not, trusted or not.
	valid, invalid []string
	// reason says why no trusted signature verifies.
	reason string
}

func (p *Policy) judge(rec repository.Record) verdict {
	var v verdict
	var changed []string
	for _, s := range rec.Signatures {
		err := s.Verify(rec)
		switch {
		case err == nil:
			v.valid = append(v.valid, s.KeyID)
			if p.Enforcing() && p.trusts(s) && v.trusted == "" {
				v.trusted = s.KeyID
			}
		default:
			v.invalid = append(v.invalid, s.KeyID)
			if p.Enforcing() && p.trusts(s) {
				changed = append(changed, s.KeyID)
			}
		}
	}
	v.reason = reasonOf(rec, v, changed)
	return v
}

// reasonOf says why rec has no valid signature by a trusted key.
func reasonOf(rec repository.Record, v verdict, changedAfter []string) string {
	if _, err := repository.SignedCore(rec); err != nil {
		return strings.TrimPrefix(err.Error(), repository.ErrUnsignable.Error()+": ")
	}
	switch {
	case len(rec.Signatures) == 0:
		return "it is unsigned"
	case len(changedAfter) > 0:
		return "its record changed after it was signed by trusted key " + strings.Join(changedAfter, ", ")
	case len(v.valid) > 0:
		return "it is signed only by keys this node does not trust (" + strings.Join(v.valid, ", ") + ")"
	}
	return "no signature verifies over its record (" + strings.Join(slices.Compact(v.invalid), ", ") + ")"
}

// Trust states, as Status reports them.
const (
	// StateVerified: signed by a key this node trusts.
	StateVerified = "verified"
	// StateRefused: this node trusts keys and none of them signed the
	// record as it is; restores are refused.
	StateRefused = "refused"
	// StateUnverified: this node trusts no key and checks nothing.
	StateUnverified = "unverified"
)

// Status is what a node makes of a record's signatures, for `snapshot
// show` and GET /snapshots/{id}.
type Status struct {
	// State is StateVerified, StateRefused or StateUnverified.
	State string `json:"state"`
	// Key is the trusted key whose signature verified (StateVerified).
	Key string `json:"key_id,omitempty"`
	// SignedBy are the keys whose signatures verify over the record,
	// trusted here or not; Invalid those whose do not (the record
	// changed after they signed it).
	SignedBy []string `json:"signed_by,omitempty"`
	Invalid  []string `json:"invalid_signatures,omitempty"`
	// Reason says why the record is refused or unverified.
	Reason string `json:"reason,omitempty"`
}

// Status is p's view of rec.
func (p *Policy) Status(rec repository.Record) Status {
	v := p.judge(rec)
	st := Status{SignedBy: v.valid, Invalid: v.invalid}
	switch {
	case !p.Enforcing():
		st.State, st.Reason = StateUnverified, "this node trusts no key ([trust] trusted_keys), so it checks no signature"
	case v.trusted != "":
		st.State, st.Key = StateVerified, v.trusted
	default:
		st.State, st.Reason = StateRefused, v.reason
	}
	return st
}

// Line is st in one line, for people.
func (st Status) Line() string {
	var b strings.Builder
	b.WriteString(st.State)
	if st.Key != "" {
		fmt.Fprintf(&b, ": signed by trusted key %s", st.Key)
	} else if st.Reason != "" {
		fmt.Fprintf(&b, ": %s", st.Reason)
	}
	if st.State != StateVerified && len(st.SignedBy) > 0 {
		fmt.Fprintf(&b, "; signed by key %s", strings.Join(st.SignedBy, ", "))
	}
	if len(st.Invalid) > 0 {
		fmt.Fprintf(&b, "; signature of %s no longer verifies", strings.Join(st.Invalid, ", "))
	}
	return b.String()
}
