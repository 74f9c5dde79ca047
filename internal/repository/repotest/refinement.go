package repotest

import (
	"bytes"
	"testing"

	"warmstart/internal/repository"
)

// RefinementOf is a refinement grown from the recorded manifest base, with
// random parts.
func RefinementOf(t testing.TB, base []byte, restores uint64) repository.Refinement {
	t.Helper()
	return repository.Refinement{BaseSHA256: SHA256Hex(base), Restores: restores, Pages: 3,
		Manifest: ManifestBytes(t, 200), State: ManifestBytes(t, 300)}
}

// CheckRefinement asserts that id's record describes want and that the
// file Resolve points at holds it, whole and as the restore reads it.
func CheckRefinement(t testing.TB, repo repository.Repository, id string, want repository.Refinement) {
	t.Helper()
	res, err := repo.Resolve(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	d := res.Record.Refinement
	if d == nil || d.ManifestSHA256 != SHA256Hex(want.Manifest) || d.ManifestSize != int64(len(want.Manifest)) ||
		d.BaseSHA256 != want.BaseSHA256 || d.Restores != want.Restores || d.Pages != want.Pages {
		t.Fatalf("record refinement %+v, want one of manifest %s after %d restores", d, SHA256Hex(want.Manifest), want.Restores)
	}
	m, state, err := repository.ReadRefinement(res.RefinementPath, *d)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m, want.Manifest) || !bytes.Equal(state, want.State) {
		t.Fatal("resolved refinement does not hold the attached parts")
	}
	if m, err = repository.ReadRefinedManifest(res.RefinementPath, *d); err != nil || !bytes.Equal(m, want.Manifest) {
		t.Fatalf("refined manifest as a restore reads it: %v", err)
	}
}

// testAttachRefinement attaches a refinement, replaces it, keeps it when
// the same manifest is attached again, and loses it to a new recording;
// the recorded manifest stays as it was throughout.
func testAttachRefinement(t *testing.T, repo repository.Repository) {
	rec, lease := Publish(t, repo, "refined")
	base := ManifestBytes(t, 64)
	if _, err := repo.AttachManifest(bg(), lease, base, nil); err != nil {
		t.Fatal(err)
	}
	first := RefinementOf(t, base, 1)
	d, err := repo.AttachRefinement(bg(), lease, first)
	if err != nil {
		t.Fatal(err)
	}
	if d.ManifestSHA256 != SHA256Hex(first.Manifest) || d.Restores != 1 {
		t.Fatalf("descriptor %+v", d)
	}
	CheckRefinement(t, repo, rec.ID, first)
	checkAttached(t, repo, rec.ID, base)

	// Learned on top of nothing while the record has the first: stale.
	second := RefinementOf(t, base, 2)
	_, err = repo.AttachRefinement(bg(), lease, second)
	wantErr(t, "refinement on top of an older one", err, repository.ErrStale)
	CheckRefinement(t, repo, rec.ID, first)
	second.PreviousSHA256 = d.SHA256
	if _, err := repo.AttachRefinement(bg(), lease, second); err != nil {
		t.Fatal(err)
	}
	CheckRefinement(t, repo, rec.ID, second)
	checkAttached(t, repo, rec.ID, base)

	// The same recording again: the refinement grew from it and stays.
	if _, err := repo.AttachManifest(bg(), lease, base, nil); err != nil {
		t.Fatal(err)
	}
	CheckRefinement(t, repo, rec.ID, second)

	// A new recording starts over: the refinement grew from another base.
	if _, err := repo.AttachManifest(bg(), lease, ManifestBytes(t, 65), nil); err != nil {
		t.Fatal(err)
	}
	res, err := repo.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Record.Refinement != nil || res.RefinementPath != "" {
		t.Fatalf("a new recording kept the refinement %+v at %q", res.Record.Refinement, res.RefinementPath)
	}
	second.PreviousSHA256 = ""
	_, err = repo.AttachRefinement(bg(), lease, second)
	wantErr(t, "refinement of the old recording", err, repository.ErrStale)
}

func testAttachRefinementRefused(t *testing.T, repo repository.Repository) {
	t.Run("no recorded manifest", func(t *testing.T) {
		rec, lease := Publish(t, repo, "")
		_, err := repo.AttachRefinement(bg(), lease, RefinementOf(t, []byte("none"), 1))
		wantErr(t, "refinement without a manifest", err, repository.ErrStale)
		if got, err := repo.Get(bg(), rec.ID); err != nil || got.Refinement != nil {
			t.Fatalf("refused attach changed the record: %+v, %v", got.Refinement, err)
		}
	})
	t.Run("bad parts", func(t *testing.T) {
		_, lease := Publish(t, repo, "")
		r := RefinementOf(t, []byte("base"), 1)
		r.Manifest = nil
		_, err := repo.AttachRefinement(bg(), lease, r)
		wantErr(t, "empty refined manifest", err, repository.ErrInvalidRequest)
	})
	t.Run("lease ended", func(t *testing.T) {
		_, lease := Publish(t, repo, "")
		base := ManifestBytes(t, 64)
		if _, err := repo.AttachManifest(bg(), lease, base, nil); err != nil {
			t.Fatal(err)
		}
		if err := lease.End(); err != nil {
			t.Fatal(err)
		}
		_, err := repo.AttachRefinement(bg(), lease, RefinementOf(t, base, 1))
		wantErr(t, "refinement after End", err, repository.ErrLeaseEnded)
	})
	t.Run("deleted", func(t *testing.T) {
		rec, lease := Publish(t, repo, "refine-deleted")
		base := ManifestBytes(t, 64)
		if _, err := repo.AttachManifest(bg(), lease, base, nil); err != nil {
			t.Fatal(err)
		}
		if err := repo.Delete(bg(), rec.ID); err != nil {
			t.Fatal(err)
		}
		_, err := repo.AttachRefinement(bg(), lease, RefinementOf(t, base, 1))
		wantErr(t, "refinement after Delete", err, repository.ErrNotFound)
		_, err = repo.Get(bg(), rec.ID)
		wantErr(t, "Get after refused refinement", err, repository.ErrNotFound)
		if recs := mustList(t, repo, repository.Filter{AliasPrefix: "refine-deleted"}); len(recs) != 0 {
			t.Fatalf("refused refinement resurrected %v", ids(recs))
		}
	})
}
