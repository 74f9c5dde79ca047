package snapcheck_test

import (
	"context"
	"crypto/ed25519"
	"path/filepath"
	"testing"

	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/snapcheck"
	"warmstart/internal/trust"
)

// TestVerifyOnATrustingNodeReportsWhatItRefuses: a node that trusts keys
// refuses to restore a snapshot no trusted key signed, even when every
// artifact matches the record (a writer of the store rewrote the record,
// the memory and the tables together). `snapshot verify` on that node
// said "ok" of it; the refusal is now a problem of kind trust, and a
// snapshot a trusted key signed stays ok.
func TestVerifyOnATrustingNodeReportsWhatItRefuses(t *testing.T) {
	publisher := repotest.NewSigningKey(t)
	repo, err := posixfs.Open(filepath.Join(t.TempDir(), "store"), posixfs.Options{SigningKey: publisher})
	if err != nil {
		t.Fatal(err)
	}
	rec, lease := repotest.PublishInputs(t, repo, repotest.NewInputs(t, 1<<20), "web")
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	other := repotest.NewSigningKey(t)
	for _, c := range []struct {
		name   string
		policy *trust.Policy
		ok     bool
	}{
		{"trusting another key", trust.NewPolicy(trust.Key{Public: other.Public().(ed25519.PublicKey)}), false},
		{"trusting the publisher", trust.NewPolicy(trust.Key{Public: publisher.Public().(ed25519.PublicKey)}), true},
		{"trusting no key", nil, true},
	} {
		r, err := snapcheck.Verify(context.Background(), repo, rec.ID, snapcheck.Options{Trust: c.policy})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		refused := false
		for _, p := range r.Problems {
			refused = refused || p.Kind == snapcheck.KindTrust
		}
		if r.OK != c.ok || refused == c.ok {
			t.Errorf("%s: ok %v, problems %v; want ok %v and a trust problem exactly when not ok", c.name, r.OK, r.Problems, c.ok)
		}
	}
}
