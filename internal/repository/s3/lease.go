package s3

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/repository"
)

// A lease is seen by every node through a lease object,
// leases/<id>/<holder>.json, one per lease (<holder> is a fresh UUIDv7),
// written when the lease is taken, written again every LeaseTTL/4 while
// it is held, and removed when it ends. The daemon's resume of
// interrupted manifest recordings claims a snapshot (ClaimLease: no live
// lease object, and the one claim object created) before it records, so a
// recording running or resumed on another node is not started again. An
// object store has no lock that dies with its holder; a lease object
// instead counts as held only until LeaseTTL after its last write
// (the store's Last-Modified), so a crashed holder's lease expires by
// itself. One object per holder, rather than one per snapshot, keeps
// "several leases on one snapshot" true without a shared count to
// update conditionally; Sweep removes expired ones.
//
// Within the process, End waits for operations under the lease, Delete
// and the attaches of one snapshot are serialised, and Delete leaves the
// artifacts of an unpublished snapshot alone while a lease on it is live
// here. Across nodes, what keeps the catalog right is the conditional
// writes alone: an attach never recreates a deleted record (If-Match), and
// of two alias binders one wins (If-None-Match). A lease object cannot
// tell a crashed publisher from a slow one whose renewals fail; the
// reclaim of an abandoned publish therefore revokes its lease object with
// a conditional write, which the publisher's own conditional writes see,
// before it removes anything (leftovers.go).

// LeaseTTL is how long after its last write a lease object counts as
// held. It is compared with the store's Last-Modified on the reader's
// clock, so it also absorbs clock skew between nodes and store.
const LeaseTTL = 2 * time.Minute

// leaseFormat is the version of the lease object encoding.
const leaseFormat = 1

// leaseObject is the content of a lease object; readers need only its
// presence and age, the content says whose it is to an operator.
//
// Written changes with every write, and with it the object's ETag (the
// MD5 of its bytes on S3 and MinIO): a revocation conditional on the ETag
// a collector listed must fail once the holder wrote the object again,
// which identical bytes, with an identical ETag, would not tell it.
type leaseObject struct {
	Format  int       `json:"format"`
	ID      string    `json:"id"`
	Holder  string    `json:"holder"`
	Host    string    `json:"host,omitempty"`
	Written time.Time `json:"written,omitzero"`
}

// leaseHold is this process's side of one lease object: the version last
// written, which a background renewal and confirmLease replace, each only
// if the object is still that version.
type leaseHold struct {
	key, holder string
	obj         leaseObject

	mu   sync.Mutex
	etag string
	// lost is set once a conditional write found the object changed or
	// gone: a collector revoked it (leftovers.go), or it expired and was
	// swept or taken over. No write under the lease may follow.
	lost bool
}

// encode is h's lease object as written now.
func (h *leaseHold) encode() []byte {
	o := h.obj
	o.Written = time.Now().UTC()
	data, _ := json.Marshal(o) // strings and a time: never fails
	return data
}

// newLease takes a lease on id: in this process, and by its lease
// object for every node.
func (r *Repo) newLease(ctx context.Context, id string) (*repository.HeldLease, error) {
	holder, err := repository.NewID()
	if err != nil {
		return nil, err
	}
	return r.newLeaseAs(ctx, id, holder, r.keys.lease(id, holder), putCondition{ifNoneMatch: true})
}

// newLeaseAs is newLease with the lease object under key, written under
// cond.
func (r *Repo) newLeaseAs(ctx context.Context, id, holder, key string, cond putCondition) (*repository.HeldLease, error) {
	host, _ := os.Hostname()
	h := &leaseHold{key: key, holder: holder, obj: leaseObject{Format: leaseFormat, ID: id, Holder: holder, Host: host}}
	etag, err := r.putSmall(ctx, key, h.encode(), cond)
	if err != nil {
		return nil, fmt.Errorf("write lease %s: %w", id, err)
	}
	h.etag = etag
	stop, renewed := make(chan struct{}), make(chan struct{})
	go r.renewLease(h, stop, renewed)
	r.leaseMu.Lock()
	r.liveLeases[id] = append(r.liveLeases[id], h)
	r.leaseMu.Unlock()
	return repository.NewHeldLease(r, id, func() {
		close(stop)
		<-renewed
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		_ = r.removeLeaseObject(ctx, key, holder) // left behind, it expires
		r.leaseEnded(id, h)
	}), nil
}

// renewLease writes the lease object again every leaseTTL/4 until stop
// closes (see rewrite). A failed write is not fatal: three more get their
// chance before the lease would expire.
func (r *Repo) renewLease(h *leaseHold, stop <-chan struct{}, renewed chan<- struct{}) {
	defer close(renewed)
	tick := time.NewTicker(r.leaseTTL / 4)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			ctx, cancel := context.WithTimeout(context.Background(), r.leaseTTL/4)
			err := r.rewrite(ctx, h)
			cancel()
			if errors.Is(err, repository.ErrLeaseEnded) {
				return
			}
		}
	}
}

// rewrite writes h's lease object again, only if it is still the version
// last written (If-Match): a holder whose renewals failed for longer than
// the TTL may have lost a claim to another node, or had a collector revoke
// its publish as abandoned, and must not overwrite that. It fails with
// ErrLeaseEnded once that happened.
func (r *Repo) rewrite(ctx context.Context, h *leaseHold) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost {
		return fmt.Errorf("%w: its lease object %s was revoked, taken over or removed", repository.ErrLeaseEnded, h.key)
	}
	data := h.encode()
	next, err := r.putSmall(ctx, h.key, data, putCondition{ifMatch: h.etag})
	if errors.Is(err, errPrecondition) {
		// A write whose answer was lost landed if the object holds its
		// bytes (the client's retry then found it changed): ours still.
		if got, info, found, gerr := r.getSmall(ctx, h.key); gerr == nil && found && bytes.Equal(got, data) {
			next, err = info.ETag, nil
		}
	}
	switch {
	case err == nil:
		h.etag = next
		return nil
	case errors.Is(err, errPrecondition) || errors.Is(err, errGone):
		h.lost = true
		return fmt.Errorf("%w: its lease object %s was revoked, taken over or removed: %w", repository.ErrLeaseEnded, h.key, err)
	}
	return err
}

// removeLeaseObject removes the lease object under key if it is still
// holder's (a claim's key is shared by every claimer of one snapshot).
func (r *Repo) removeLeaseObject(ctx context.Context, key, holder string) error {
	data, _, found, err := r.getSmall(ctx, key)
	if err != nil || !found {
		return err
	}
	var lo leaseObject
	if json.Unmarshal(data, &lo) == nil && lo.Holder != holder {
		return nil
	}
	return r.remove(ctx, key)
}

func (r *Repo) leaseEnded(id string, h *leaseHold) {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	holds := slices.DeleteFunc(r.liveLeases[id], func(o *leaseHold) bool { return o == h })
	if len(holds) == 0 {
		delete(r.liveLeases, id)
		return
	}
	r.liveLeases[id] = holds
}

// leaseLive reports whether this process holds a lease on id.
func (r *Repo) leaseLive(id string) bool {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	return len(r.liveLeases[id]) > 0
}

// confirmLease writes a lease this process holds on id again, now (see
// rewrite): proof, for the next abandoned grace, that no collector has
// reclaimed the snapshot's objects. It fails with ErrLeaseEnded when that
// happened, or no lease on id is held here.
func (r *Repo) confirmLease(ctx context.Context, id string) error {
	h := r.heldLease(id)
	if h == nil {
		return fmt.Errorf("%w: no lease on %s is held here", repository.ErrLeaseEnded, id)
	}
	return r.rewrite(ctx, h)
}

// heldLease is the first lease this process holds on id, nil for none.
func (r *Repo) heldLease(id string) *leaseHold {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	if holds := r.liveLeases[id]; len(holds) > 0 {
		return holds[0]
	}
	return nil
}

// leaseLost reports whether the lease this process holds on id lost its
// lease object: a write of it found it revoked, taken over or removed.
func (r *Repo) leaseLost(id string) bool {
	h := r.heldLease(id)
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

// leaseObjectsLive reports whether any node holds a lease on id: a lease
// object under it written less than leaseTTL ago.
func (r *Repo) leaseObjectsLive(ctx context.Context, id string) (bool, error) {
	objs, err := r.list(ctx, r.keys.leasesOf(id))
	if err != nil {
		return false, err
	}
	for _, o := range objs {
		if time.Since(o.LastModified) < r.leaseTTL {
			return true, nil
		}
	}
	return false, nil
}

// sweepLeases removes lease objects that have expired: their holders
// crashed, or cannot reach the store (a live holder rewrites its object
// long before). An object stays for the abandoned grace at least: it is
// its publisher's last sign of life, which the reclaim of an abandoned
// publish must see to revoke (leftovers.go). Without it, a publisher that
// confirmed its lease and then could not write it for twice the TTL would
// be taken for dead while its record may still land unchecked. Each is
// revoked first, conditionally on the version listed, and removed only
// then (endLeases): a holder that wrote it since the listing lives, and
// keeps it (a plain DELETE would have taken a publisher's confirmation
// of its lease, right before its record).
func (r *Repo) sweepLeases(ctx context.Context, fail *failures) error {
	objs, err := r.list(ctx, r.keys.prefix+leasesDir)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if age := time.Since(o.LastModified); age >= 2*r.leaseTTL && age > r.abandonedGrace {
			run1(r.beforeSweepLease, o.Key)
			id, _, _ := strings.Cut(strings.TrimPrefix(o.Key, r.keys.prefix+leasesDir), "/")
			if r.leaseLive(id) {
				continue // held here: its renewals are only late
			}
			if _, err := r.endLeases(ctx, id, []minio.ObjectInfo{o}); err != nil {
				if err := fail.add(ctx, id, "remove an expired lease", err); err != nil {
					return err
				}
			}
		}
	}
	return nil
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

// LeaseHeld implements repository.Repository: a lease held by this
// process, or a live lease object of any node (see above).
func (r *Repo) LeaseHeld(ctx context.Context, id string) (bool, error) {
	if err := repository.ValidateID(id); err != nil {
		return false, fmt.Errorf("lease held: %w", err)
	}
	if r.leaseLive(id) {
		return true, nil
	}
	held, err := r.leaseObjectsLive(ctx, id)
	if err != nil {
		return false, fmt.Errorf("lease held %s: %w", id, err)
	}
	return held, nil
}

// ClaimLease implements repository.Repository. A claim is the one claim
// object of a snapshot, leases/<id>/claim.json, created with If-None-Match:
// of claimers racing on any nodes the store lets exactly one create it. A
// claim object that has expired (its holder crashed) is taken over with
// If-Match on its ETag, so again one taker wins. Plain leases (a recording
// under way) are checked first: while one is live, nothing is claimed.
func (r *Repo) ClaimLease(ctx context.Context, id string) (repository.Lease, bool, error) {
	if err := repository.ValidateID(id); err != nil {
		return nil, false, fmt.Errorf("claim lease: %w", err)
	}
	if err := r.writable(); err != nil {
		return nil, false, fmt.Errorf("claim lease: %w", err)
	}
	if _, _, err := r.getRecord(ctx, id); err != nil {
		return nil, false, fmt.Errorf("claim lease: %w", err)
	}
	if held, err := r.LeaseHeld(ctx, id); err != nil || held {
		return nil, false, err
	}
	holder, err := repository.NewID()
	if err != nil {
		return nil, false, fmt.Errorf("claim lease %s: %w", id, err)
	}
	key := r.keys.claim(id)
	lease, err := r.newLeaseAs(ctx, id, holder, key, putCondition{ifNoneMatch: true})
	if errors.Is(err, errPrecondition) {
		lease, err = r.takeOverClaim(ctx, id, holder, key)
	}
	if errors.Is(err, errPrecondition) || errors.Is(err, errGone) {
		return nil, false, nil // another claimer won
	}
	if err != nil {
		return nil, false, fmt.Errorf("claim lease: %w", err)
	}
	if lease == nil {
		return nil, false, nil // a live claim of another node
	}
	return lease, true, nil
}

// takeOverClaim takes over the claim object under key if it has expired;
// it returns no lease and no error while the claim is live.
func (r *Repo) takeOverClaim(ctx context.Context, id, holder, key string) (*repository.HeldLease, error) {
	info, err := r.core.StatObject(ctx, r.bucket, key, minio.StatObjectOptions{})
	if isNotFound(err) {
		return nil, errGone // ended meanwhile: try again at the next start
	}
	if err != nil {
		return nil, ctxErr(ctx, fmt.Errorf("stat %s: %w", key, err))
	}
	if time.Since(info.LastModified) < r.leaseTTL {
		return nil, nil
	}
	return r.newLeaseAs(ctx, id, holder, key, putCondition{ifMatch: info.ETag})
}

// run1 calls hook with arg when it is set.
func run1[T any](hook func(T), arg T) {
	if hook != nil {
		hook(arg)
	}
}
