package posixfs

import (
	"fmt"
	"sync"

	"warmstart/internal/repository"
)

// A capture lease is a shared flock on catalog/leases/<id>.lock held for the
// lease's life. Other processes learn from it whether anyone still works on
// a snapshot: the sweep reclaims the directory of an unpublished snapshot
// only when it can take that lock exclusively, which the kernel allows as
// soon as every holder has ended its lease or died.
type lease struct {
	repo *Repo
	id   string

	// mu is read-held by every operation that acts under the lease and
	// write-held by End, so End waits for them and none starts after it.
	mu    sync.RWMutex
	lock  *fileLock
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
	l.lock.release()
	return nil
}

// use marks the start of an operation under the lease; the caller must call
// l.mu.RUnlock when done (only if use returned nil).
func (l *lease) use() error {
	l.mu.RLock()
	if l.ended {
		l.mu.RUnlock()
		return fmt.Errorf("snapshot %s: %w", l.id, repository.ErrLeaseEnded)
	}
	return nil
}

// ownLease returns the posixfs lease behind a repository.Lease issued by r.
func (r *Repo) ownLease(l repository.Lease) (*lease, error) {
	own, ok := l.(*lease)
	if !ok || own == nil || own.repo != r {
		return nil, fmt.Errorf("%w: the lease was not issued by this repository", repository.ErrInvalidRequest)
	}
	return own, nil
}

// leaseLive reports whether any process holds a lease on id. It is only a
// snapshot of the moment; callers act on it under the record lock.
//
// When no lease is live it returns the exclusive lease lock, which keeps
// LeaseExisting out until released.
func (r *Repo) leaseLive(id string) (bool, *fileLock, error) {
	l, busy, err := tryLock(r.paths.leasePath(id), lockExclusive)
	return busy, l, err
}
