package repotest

import (
	"crypto/ed25519"
	"crypto/rand"
	"slices"
	"testing"

	"warmstart/internal/repository"
)

// OpenSigning opens a fresh, empty repository whose publishes sign with
// key (nil: a repository that signs nothing).
type OpenSigning func(t *testing.T, key ed25519.PrivateKey) repository.Repository

// RunSigning checks how a backend keeps records' signatures: a publish
// with a key commits a record already signed, attaching a manifest or a
// refinement keeps the signatures, attaching another digest table drops
// the ones it makes invalid, and AttachSignature adds, replaces and
// refuses signatures as the contract says.
func RunSigning(t *testing.T, open OpenSigning) {
	tests := []struct {
		name string
		fn   func(*testing.T, OpenSigning)
	}{
		{"PublishSigns", testPublishSigns},
		{"AttachmentsKeepSignatures", testAttachmentsKeepSignatures},
		{"NewDigestTableDropsSignatures", testNewTableDropsSignatures},
		{"AttachSignature", testAttachSignature},
		{"AttachSignatureRefused", testAttachSignatureRefused},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open)
		})
	}
}

// NewSigningKey is a fresh Ed25519 private key.
func NewSigningKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// signedBy returns the ids of the keys whose signatures of rec verify,
// and fails the test for a signature that does not.
func signedBy(t *testing.T, rec repository.Record) []string {
	t.Helper()
	var ids []string
	for _, s := range rec.Signatures {
		if err := s.Verify(rec); err != nil {
			t.Fatalf("signature by %s of record %s: %v", s.KeyID, rec.ID, err)
		}
		ids = append(ids, s.KeyID)
	}
	slices.Sort(ids)
	return ids
}

// stored is the record of id as Get and Resolve give it; both must agree.
func stored(t *testing.T, repo repository.Repository, id string) repository.Record {
	t.Helper()
	rec, err := repo.Get(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	res, err := repo.Resolve(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(rec.Signatures, res.Record.Signatures, func(a, b repository.Signature) bool {
		return a.KeyID == b.KeyID && string(a.Value) == string(b.Value)
	}) {
		t.Fatalf("Get and Resolve give other signatures: %+v, %+v", rec.Signatures, res.Record.Signatures)
	}
	return rec
}

func keyIDOf(key ed25519.PrivateKey) string {
	return repository.KeyID(key.Public().(ed25519.PublicKey))
}

func testPublishSigns(t *testing.T, open OpenSigning) {
	key := NewSigningKey(t)
	repo := open(t, key)
	rec, _ := Publish(t, repo, "signed")
	if got := signedBy(t, rec); !slices.Equal(got, []string{keyIDOf(key)}) {
		t.Fatalf("published record signed by %v, want %s", got, keyIDOf(key))
	}
	if got := signedBy(t, stored(t, repo, rec.ID)); !slices.Equal(got, []string{keyIDOf(key)}) {
		t.Fatalf("stored record signed by %v, want %s", got, keyIDOf(key))
	}
	unsigned := open(t, nil)
	other, _ := Publish(t, unsigned, "")
	if len(other.Signatures) != 0 || len(stored(t, unsigned, other.ID).Signatures) != 0 {
		t.Fatalf("a repository without a key signed: %+v", other.Signatures)
	}
}

func testAttachmentsKeepSignatures(t *testing.T, open OpenSigning) {
	key := NewSigningKey(t)
	repo := open(t, key)
	rec, lease := Publish(t, repo, "")
	base := ManifestBytes(t, 64)
	if _, err := repo.AttachManifest(bg(), lease, base, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.AttachRefinement(bg(), lease, RefinementOf(t, base, 1)); err != nil {
		t.Fatal(err)
	}
	got := stored(t, repo, rec.ID)
	if ids := signedBy(t, got); !slices.Equal(ids, []string{keyIDOf(key)}) || got.Manifest == nil || got.Refinement == nil {
		t.Fatalf("after attaching a manifest and a refinement: signed by %v, manifest %v, refinement %v", ids, got.Manifest, got.Refinement)
	}
}

func testNewTableDropsSignatures(t *testing.T, open OpenSigning) {
	key := NewSigningKey(t)
	repo := open(t, key)
	in := NewInputs(t, SmallMemoryBytes)
	rec, lease := PublishInputs(t, repo, in, "")
	if _, err := repo.AttachDigests(bg(), lease, DigestTable(t, in.MemoryPath)); err != nil {
		t.Fatal(err)
	}
	if ids := signedBy(t, stored(t, repo, rec.ID)); len(ids) != 1 {
		t.Fatalf("attaching the same table again left signatures %v, want the publisher's", ids)
	}
	if _, err := repo.AttachDigests(bg(), lease, DigestTable(t, NewInputs(t, SmallMemoryBytes).MemoryPath)); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, repo, rec.ID); len(got.Signatures) != 0 {
		t.Fatalf("another table kept signatures of the old one: %+v", got.Signatures)
	}
}

func testAttachSignature(t *testing.T, open OpenSigning) {
	publisher, rotated := NewSigningKey(t), NewSigningKey(t)
	repo := open(t, publisher)
	rec, lease := Publish(t, repo, "")
	for range 2 { // the second replaces the first by the same key
		sig, err := repository.Sign(stored(t, repo, rec.ID), rotated)
		if err != nil {
			t.Fatal(err)
		}
		if err := repo.AttachSignature(bg(), lease, sig); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{keyIDOf(publisher), keyIDOf(rotated)}
	slices.Sort(want)
	if got := signedBy(t, stored(t, repo, rec.ID)); !slices.Equal(got, want) {
		t.Fatalf("signed by %v, want %v", got, want)
	}
}

func testAttachSignatureRefused(t *testing.T, open OpenSigning) {
	repo := open(t, nil)
	key := NewSigningKey(t)
	rec, lease := Publish(t, repo, "")
	other, _ := Publish(t, repo, "")
	theirs, err := repository.Sign(other, key)
	if err != nil {
		t.Fatal(err)
	}
	err = repo.AttachSignature(bg(), lease, theirs)
	wantErr(t, "AttachSignature of another record's signature", err, repository.ErrStale)
	malformed := theirs
	malformed.Value = malformed.Value[:10]
	err = repo.AttachSignature(bg(), lease, malformed)
	wantErr(t, "AttachSignature of a malformed signature", err, repository.ErrInvalidRequest)
	if got := stored(t, repo, rec.ID); len(got.Signatures) != 0 {
		t.Fatalf("refused signatures were stored: %+v", got.Signatures)
	}
	ours, err := repository.Sign(rec, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "AttachSignature after End", repo.AttachSignature(bg(), lease, ours), repository.ErrLeaseEnded)
	lease, err = repo.LeaseExisting(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	if err := repo.Delete(bg(), rec.ID); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "AttachSignature after Delete", repo.AttachSignature(bg(), lease, ours), repository.ErrNotFound)
	_, err = repo.Get(bg(), rec.ID)
	wantErr(t, "Get after refused AttachSignature", err, repository.ErrNotFound)
}
