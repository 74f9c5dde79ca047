package repotest

import (
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
