package restore_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs/posixfstest"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
	"warmstart/internal/snapcheck"
	"warmstart/internal/trust"
)

// sign signs the env's snapshot with a fresh key, as `snapshot sign`
// does, and returns the key.
func (e *env) sign(t *testing.T) trust.Key {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(nil)
	must(t, err)
	rec, err := e.repo.Get(context.Background(), e.id)
	must(t, err)
	sig, err := repository.Sign(rec, priv)
	must(t, err)
	lease, err := e.repo.LeaseExisting(context.Background(), e.id)
	must(t, err)
	defer lease.End()
	must(t, e.repo.AttachSignature(context.Background(), lease, sig))
	return trust.Key{Public: pub, Private: priv}
}

// trusting is the env's restorer on a node that trusts keys.
func (e *env) trusting(keys ...trust.Key) *restore.Restorer {
	r := *e.restorer
	r.Trust = trust.NewPolicy(keys...)
	return &r
}

func (e *env) restoreWith(r *restore.Restorer, device string) (*restore.Instance, error) {
	res, err := e.repo.Resolve(context.Background(), e.id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	return r.Restore(ctx, restore.SourceOf(res), restore.Options{Device: device, Prefetch: restore.ModeOn})
}

// A node that trusts the publisher's key restores the signed snapshot;
// a node that trusts another key, or is given an unsigned one, refuses it
// before any memory is served, naming the snapshot and why.
func TestTrustingNodeRestoresOnlyWhatItsKeysSigned(t *testing.T) {
	e := newEnv(t, envOptions{})
	stranger := trust.Key{Public: repotest.NewSigningKey(t).Public().(ed25519.PublicKey)}
	for _, device := range devices {
		inst, err := e.restoreWith(e.trusting(stranger), device)
		checkRefused(t, e, inst, err, "it is unsigned")
	}
	publisher := e.sign(t)
	for _, device := range devices {
		inst, err := e.restoreWith(e.trusting(publisher), device)
		if err != nil {
			t.Fatalf("%s: restore on a node trusting the publisher: %v", device, err)
		}
		checkHash(t, inst, e.ref.expected)
		stop(t, inst)
		inst, err = e.restoreWith(e.trusting(stranger), device)
		checkRefused(t, e, inst, err, "signed only by keys this node does not trust")
	}
}

// Failure 3 of the adversarial pass: a writer of the store rewrites a
// page the guest touches, its digest-table entry and the record's two
// SHA-256 fields. Every check that starts from the record passes: a node
// that trusts no key serves the attacker's bytes and verify says ok. A
// node that trusts the publisher's key refuses the snapshot, before any
// memory is served, because the record changed after it was signed.
func TestRewrittenStoreIsRefusedByANodeTrustingThePublisher(t *testing.T) {
	e := newEnv(t, envOptions{})
	publisher := e.sign(t)
	touched, _ := pagesOf(t, e)
	posixfstest.RewriteMemory(t, e.repo.Root(), e.id, touched, []byte("the attacker's bytes"))

	rep, err := snapcheck.Verify(context.Background(), e.repo, e.id, snapcheck.Options{})
	must(t, err)
	if !rep.OK {
		t.Fatalf("the rewrite is not the consistent one failure 3 made: verify says %+v", rep)
	}
	inst, err := e.restoreWith(e.restorer, devices[0])
	must(t, err)
	if inst.Ready.Detail.SHA256 == e.ref.expected {
		t.Error("a node that trusts no key read the published bytes from the rewritten store")
	}
	stop(t, inst)

	before := len(e.vm.all())
	for _, device := range devices {
		inst, err := e.restoreWith(e.trusting(publisher), device)
		checkRefused(t, e, inst, err, "changed after it was signed by trusted key "+publisher.ID())
	}
	if len(e.vm.all()) != before {
		t.Error("a refused restore started a VM")
	}
}

func checkRefused(t *testing.T, e *env, inst *restore.Instance, err error, reason string) {
	t.Helper()
	if err == nil {
		stop(t, inst)
		t.Fatalf("restore succeeded; want it refused because %s", reason)
	}
	var re *trust.RefusedError
	if !errors.Is(err, trust.ErrUntrusted) || !errors.As(err, &re) || re.Snapshot != e.id || !strings.Contains(err.Error(), reason) {
		t.Fatalf("restore = %v; want a refusal of %s because %s", err, e.id, reason)
	}
}
