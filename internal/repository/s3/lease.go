package s3

import (
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
type lease struct {
	repo *Repo
	id   string

	// mu is read-held by every operation under the lease and write-held
	// by End, so End waits for them and none starts after it.
	mu    sync.RWMutex
	ended bool
	done  chan struct{}
}

var _ repository.Lease = (*lease)(nil)

func (l *lease) SnapshotID() string    { return l.id }
func (l *lease) Done() <-chan struct{} { return l.done }

func (l *lease) End() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return nil
	}
	l.ended = true
	close(l.done)
	l.repo.leaseEnded(l.id)
	return nil
}

// use marks the start of an operation under the lease; the caller must
// call l.mu.RUnlock when done (only if use returned nil).
func (l *lease) use() error {
	l.mu.RLock()
	if l.ended {
		l.mu.RUnlock()
		return fmt.Errorf("snapshot %s: %w", l.id, repository.ErrLeaseEnded)
	}
	return nil
}

func (r *Repo) newLease(id string) *lease {
	r.leaseMu.Lock()
	r.liveLeases[id]++
	r.leaseMu.Unlock()
	return &lease{repo: r, id: id, done: make(chan struct{})}
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

// ownLease returns the lease behind a repository.Lease issued by r.
func (r *Repo) ownLease(l repository.Lease) (*lease, error) {
	own, ok := l.(*lease)
	if !ok || own == nil || own.repo != r {
		return nil, fmt.Errorf("%w: the lease was not issued by this repository", repository.ErrInvalidRequest)
	}
	return own, nil
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
