package snapcheck

import (
	"os"
	"testing"

	"warmstart/internal/manifest"
	"warmstart/internal/refine"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// refined attaches a refinement of the fixture's manifest and returns its
// file name and path.
func (f *fixture) refined(t *testing.T) (string, string) {
	t.Helper()
	data, err := os.ReadFile(f.files.ManifestPath)
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	st := refine.Initial(m, f.rec.Manifest.SHA256)
	_, mdata, err := st.Manifest(f.rec.Layout)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := st.Encode()
	if err != nil {
		t.Fatal(err)
	}
	lease, err := f.repo.LeaseExisting(bg(), f.rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	d, err := f.repo.AttachRefinement(bg(), lease, repository.Refinement{BaseSHA256: st.BaseSHA256, Restores: 1,
		Pages: int64(len(st.Pages)), Manifest: mdata, State: enc})
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.repo.Resolve(bg(), f.rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	return repository.RefinementFileName(d.SHA256), res.RefinementPath
}

// A snapshot's refinement is read and checked with the other artifacts: a
// good one is ok, a flipped byte in it is a problem.
func TestRefinementIsVerified(t *testing.T) {
	f := newFixture(t)
	name, path := f.refined(t)
	r := verify(t, f.repo, "web", Options{})
	if !r.OK {
		t.Fatalf("clean refined snapshot: %+v", r)
	}
	wantArtifact(t, r, name, StatusOK)
	writable(t, path, func() { repotest.FlipBytes(t, path, 40) })
	r = verify(t, f.repo, "web", Options{})
	if r.OK {
		t.Fatal("a damaged refinement verified ok")
	}
	wantArtifact(t, r, name, StatusBad, KindSHA256)
}

// A refinement attached after verify read the record (a restore's
// learning racing a verify) is checked with the record Resolve returned:
// before, the report listed the older record's artifacts and the check of
// the refinement panicked on a name it did not hold (a 500 in the daemon).
func TestRefinementAttachedDuringVerify(t *testing.T) {
	f := newFixture(t)
	stale := f.rec
	name, _ := f.refined(t)
	r, err := verifyRecord(bg(), f.repo, f.repo, stale, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK {
		t.Fatalf("refined during verify: %+v", r)
	}
	wantArtifact(t, r, name, StatusOK)
}
