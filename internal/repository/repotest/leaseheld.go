package repotest

import (
	"errors"
	"testing"

	"warmstart/internal/repository"
)

// testLeaseHeld: LeaseHeld sees a lease while it is held, and a publish
// that asks for a manifest says so in its record until one is attached.
func testLeaseHeld(t *testing.T, repo repository.Repository) {
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	req := NewInputs(t, SmallMemoryBytes).Request("wanted")
	req.RecordManifest = true
	rec, err := repo.Publish(bg(), lease, req)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := repo.LeaseHeld(bg(), rec.ID); err != nil || !held {
		t.Fatalf("LeaseHeld during the lease = %v, %v", held, err)
	}
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	if held, err := repo.LeaseHeld(bg(), rec.ID); err != nil || held {
		t.Fatalf("LeaseHeld after End = %v, %v", held, err)
	}
	got, err := repo.Get(bg(), rec.ID)
	if err != nil || !got.ManifestRequested || got.Manifest != nil {
		t.Fatalf("Get = %+v, %v; want manifest_requested and no manifest", got, err)
	}
	plain, _ := Publish(t, repo, "plain")
	if plain.ManifestRequested {
		t.Fatal("a publish that asked for no manifest is marked as asking")
	}
}

// testClaimLease: a claim stands only while no other lease on the snapshot
// is held, and of claims racing for one snapshot exactly one stands.
func testClaimLease(t *testing.T, repo repository.Repository) {
	rec, capture := Publish(t, repo, "claimed")
	capture.End()
	plain, err := repo.LeaseExisting(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if lz, ok, err := repo.ClaimLease(bg(), rec.ID); err != nil || ok || lz != nil {
		t.Fatalf("ClaimLease beside a held lease = %v, %v, %v; want not claimed", lz, ok, err)
	}
	plain.End()

	const claimers = 4
	type claim struct {
		lease repository.Lease
		ok    bool
		err   error
	}
	results := make(chan claim, claimers)
	start := make(chan struct{})
	for range claimers {
		go func() {
			<-start
			lz, ok, err := repo.ClaimLease(bg(), rec.ID)
			results <- claim{lz, ok, err}
		}()
	}
	close(start)
	var won []repository.Lease
	for range claimers {
		c := <-results
		if c.err != nil {
			t.Errorf("ClaimLease: %v", c.err)
		}
		if c.ok {
			won = append(won, c.lease)
		}
	}
	if len(won) != 1 {
		t.Fatalf("%d of %d racing claims stood; want exactly one", len(won), claimers)
	}
	if held, err := repo.LeaseHeld(bg(), rec.ID); err != nil || !held {
		t.Fatalf("LeaseHeld under the claim = %v, %v", held, err)
	}
	won[0].End()
	lz, ok, err := repo.ClaimLease(bg(), rec.ID)
	if err != nil || !ok {
		t.Fatalf("ClaimLease after the claim ended = %v, %v", ok, err)
	}
	lz.End()
	if _, _, err := repo.ClaimLease(bg(), "01900000-0000-7000-8000-000000000000"); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("ClaimLease of an unknown snapshot: %v, want ErrNotFound", err)
	}
}
