package posixfs

import (
	"context"
	"fmt"

	"warmstart/internal/repository"
)

// A capture lease (repository.HeldLease) is a shared flock on
// catalog/leases/<id>.lock held for the lease's life, released when it
// ends. Other processes learn from it whether anyone still works on a
// snapshot: the sweep reclaims the directory of an unpublished snapshot
// only when it can take that lock exclusively, which the kernel allows as
// soon as every holder has ended its lease or died.
func (r *Repo) newLease(id string, lk *fileLock) *repository.HeldLease {
	return repository.NewHeldLease(r, id, lk.release)
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

// LeaseHeld implements repository.Repository: a lease is held while any
// process holds its shared flock. Probing takes the lock file briefly, so
// it needs a writable store.
func (r *Repo) LeaseHeld(_ context.Context, id string) (bool, error) {
	if err := repository.ValidateID(id); err != nil {
		return false, fmt.Errorf("lease held: %w", err)
	}
	if err := r.writable(); err != nil {
		return false, fmt.Errorf("lease held: %w", err)
	}
	live, lk, err := r.leaseLive(id)
	if lk != nil {
		lk.release()
	}
	if err != nil {
		return false, fmt.Errorf("lease held %s: %w", id, err)
	}
	return live, nil
}

// ClaimLease implements repository.Repository. Claims of one snapshot are
// serialised by its record lock: under it, a claim takes the lease only
// when no process holds one (the exclusive probe of LeaseHeld succeeds).
func (r *Repo) ClaimLease(ctx context.Context, id string) (repository.Lease, bool, error) {
	if err := r.writable(); err != nil {
		return nil, false, fmt.Errorf("claim lease: %w", err)
	}
	if err := repository.ValidateID(id); err != nil {
		return nil, false, fmt.Errorf("claim lease: %w", err)
	}
	rl, err := acquireLock(ctx, r.paths.recordLockPath(id), lockExclusive)
	if err != nil {
		return nil, false, fmt.Errorf("claim lease %s: %w", id, err)
	}
	defer rl.release()
	live, probe, err := r.leaseLive(id)
	probe.release()
	if err != nil {
		return nil, false, fmt.Errorf("claim lease %s: %w", id, err)
	}
	if live {
		return nil, false, nil
	}
	lease, err := r.LeaseExisting(ctx, id)
	if err != nil {
		return nil, false, fmt.Errorf("claim lease: %w", err)
	}
	return lease, true, nil
}
