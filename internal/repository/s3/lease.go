package s3

import (
	"context"
	"fmt"
	"sync"

	"warmstart/internal/repository"
)

// Leases live in the process that took them. An object store offers no
// lock that dies with its holder, so leases cannot be seen across nodes:
//
//   - Within a process, End waits for operations under the lease, Delete
//     and the attaches of one snapshot are serialised, and Delete leaves
//     the artifacts of an unpublished snapshot alone while a lease on it
//     is live.
//   - Across processes and nodes, what keeps the catalog right is the
//     conditional writes alone: an attach never recreates a deleted record
//     (If-Match), and of two alias binders one wins (If-None-Match). What
//     a lease cannot do across nodes is tell a crashed publisher from a
//     slow one; so the artifacts of a snapshot that has no record are
//     reclaimed only once its id (a UUIDv7, which carries its creation
//     time) is older than PublishGrace (see Sweep and Delete).
//
// A lease is a repository.HeldLease; the repository counts the live ones
// per id, for Delete and Sweep to consult.
func (r *Repo) newLease(id string) *repository.HeldLease {
	r.leaseMu.Lock()
	r.liveLeases[id]++
	r.leaseMu.Unlock()
	return repository.NewHeldLease(r, id, func() { r.leaseEnded(id) })
}

func (r *Repo) leaseEnded(id string) {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	if r.liveLeases[id]--; r.liveLeases[id] <= 0 {
		delete(r.liveLeases, id)
	}
}

// leaseLive reports whether this process holds a lease on id.
func (r *Repo) leaseLive(id string) bool {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	return r.liveLeases[id] > 0
}

// idLocks serialises changes to one snapshot within the process.
type idLocks struct {
	mu sync.Mutex
	m  map[string]*idLock
}

type idLock struct {
	mu   sync.Mutex
	refs int
}

// lock locks id and returns the unlock function.
func (k *idLocks) lock(id string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = make(map[string]*idLock)
	}
	l := k.m[id]
	if l == nil {
		l = &idLock{}
		k.m[id] = l
	}
	l.refs++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.m, id)
		}
		k.mu.Unlock()
	}
}

// LeaseHeld implements repository.Repository. Leases live in the process
// that holds them (see above), so only this process's leases are seen.
func (r *Repo) LeaseHeld(_ context.Context, id string) (bool, error) {
	if err := repository.ValidateID(id); err != nil {
		return false, fmt.Errorf("lease held: %w", err)
	}
	return r.leaseLive(id), nil
}
