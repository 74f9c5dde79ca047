package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"warmstart/internal/repository"
)

// timedRepository is a Repository that observes the latency of every
// operation of the one it wraps. Leases pass through untouched: a backend
// recognises only the leases it issued.
type timedRepository struct {
	inner   repository.Repository
	seconds *prometheus.HistogramVec
}

var _ repository.Repository = (*timedRepository)(nil)

// Unwrap returns the repository this one times, so that a caller can
// reach what only its backend offers (s3.Repo.VerifyStartupPack).
func (r *timedRepository) Unwrap() repository.Repository { return r.inner }

// TakeSweptAlias forwards repository.SweptAliases to the backend: a
// DELETE of an alias the backend's open swept away must release it, as
// the CLI's delete on the bare backend does, not answer "not found".
func (r *timedRepository) TakeSweptAlias(alias string) (id string, ok bool) {
	s, ok := r.inner.(repository.SweptAliases)
	if !ok {
		return "", false
	}
	return s.TakeSweptAlias(alias)
}

var _ repository.SweptAliases = (*timedRepository)(nil)

// rootedRepository is a timedRepository of a backend that keeps its
// files under a root directory (posixfs): a node stages a capture there,
// so that publishing hard-links rather than copies (node.stagingDir), and
// asks for it by type assertion. A separate type, because a backend
// without a root (s3) must not seem to have one.
type rootedRepository struct {
	*timedRepository
	rooted interface{ Root() string }
}

// Root forwards to the backend.
func (r rootedRepository) Root() string { return r.rooted.Root() }

// timed starts timing op; deferring the call of its result with the
// address of the named error result observes the outcome on return.
func (r *timedRepository) timed(op string) func(*error) {
	start := time.Now()
	return func(err *error) {
		outcome := "ok"
		switch {
		case errors.Is(*err, repository.ErrNotFound):
			outcome = "not_found"
		case *err != nil:
			outcome = "error"
		}
		r.seconds.WithLabelValues(op, outcome).Observe(time.Since(start).Seconds())
	}
}

func (r *timedRepository) BeginCapture(ctx context.Context) (l repository.Lease, err error) {
	defer r.timed("begin_capture")(&err)
	return r.inner.BeginCapture(ctx)
}

func (r *timedRepository) Publish(ctx context.Context, lease repository.Lease, req repository.PublishRequest) (rec repository.Record, err error) {
	defer r.timed("publish")(&err)
	return r.inner.Publish(ctx, lease, req)
}

func (r *timedRepository) LeaseExisting(ctx context.Context, id string) (l repository.Lease, err error) {
	defer r.timed("lease_existing")(&err)
	return r.inner.LeaseExisting(ctx, id)
}

func (r *timedRepository) ClaimLease(ctx context.Context, id string) (l repository.Lease, ok bool, err error) {
	defer r.timed("claim_lease")(&err)
	return r.inner.ClaimLease(ctx, id)
}

func (r *timedRepository) Get(ctx context.Context, id string) (rec repository.Record, err error) {
	defer r.timed("get")(&err)
	return r.inner.Get(ctx, id)
}

func (r *timedRepository) List(ctx context.Context, f repository.Filter) (recs []repository.Record, err error) {
	defer r.timed("list")(&err)
	return r.inner.List(ctx, f)
}

func (r *timedRepository) LeaseHeld(ctx context.Context, id string) (held bool, err error) {
	defer r.timed("lease_held")(&err)
	return r.inner.LeaseHeld(ctx, id)
}

func (r *timedRepository) Damaged(ctx context.Context) (ds []repository.Damage, err error) {
	defer r.timed("damaged")(&err)
	return r.inner.Damaged(ctx)
}

func (r *timedRepository) ResolveAlias(ctx context.Context, alias string) (id string, err error) {
	defer r.timed("resolve_alias")(&err)
	return r.inner.ResolveAlias(ctx, alias)
}

func (r *timedRepository) Lookup(ctx context.Context, ref string) (rec repository.Record, err error) {
	defer r.timed("lookup")(&err)
	return r.inner.Lookup(ctx, ref)
}

func (r *timedRepository) Resolve(ctx context.Context, id string) (res repository.Resolved, err error) {
	defer r.timed("resolve")(&err)
	return r.inner.Resolve(ctx, id)
}

func (r *timedRepository) Delete(ctx context.Context, id string) (err error) {
	defer r.timed("delete")(&err)
	return r.inner.Delete(ctx, id)
}

// DeleteRecorded forwards repository.RecordedDeleter, so that concurrent
// DELETEs of one snapshot report it deleted once; a backend without it
// gets a plain Delete.
func (r *timedRepository) DeleteRecorded(ctx context.Context, id string) (err error) {
	defer r.timed("delete")(&err)
	if d, ok := r.inner.(repository.RecordedDeleter); ok {
		return d.DeleteRecorded(ctx, id)
	}
	return r.inner.Delete(ctx, id)
}

func (r *timedRepository) AttachManifest(ctx context.Context, lease repository.Lease, data []byte, rec *repository.Recording) (d repository.ManifestDescriptor, err error) {
	defer r.timed("attach_manifest")(&err)
	return r.inner.AttachManifest(ctx, lease, data, rec)
}

func (r *timedRepository) AttachDigests(ctx context.Context, lease repository.Lease, data []byte) (d repository.DigestsDescriptor, err error) {
	defer r.timed("attach_digests")(&err)
	return r.inner.AttachDigests(ctx, lease, data)
}

func (r *timedRepository) AttachSignature(ctx context.Context, lease repository.Lease, sig repository.Signature) (err error) {
	defer r.timed("attach_signature")(&err)
	return r.inner.AttachSignature(ctx, lease, sig)
}

func (r *timedRepository) AttachRefinement(ctx context.Context, lease repository.Lease, ref repository.Refinement) (d repository.RefinementDescriptor, err error) {
	defer r.timed("attach_refinement")(&err)
	return r.inner.AttachRefinement(ctx, lease, ref)
}

func (r *timedRepository) PublishLayer(ctx context.Context, lease repository.Lease, req repository.LayerPublishRequest) (rec repository.Record, err error) {
	defer r.timed("publish_layer")(&err)
	return r.inner.PublishLayer(ctx, lease, req)
}

func (r *timedRepository) ReplaceMemory(ctx context.Context, lease repository.Lease, req repository.ReplaceMemoryRequest) (rec repository.Record, err error) {
	defer r.timed("replace_memory")(&err)
	return r.inner.ReplaceMemory(ctx, lease, req)
}

func (r *timedRepository) Dependents(ctx context.Context, id string) (live, inProgress []string, err error) {
	defer r.timed("dependents")(&err)
	return r.inner.Dependents(ctx, id)
}
