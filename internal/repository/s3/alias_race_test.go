package s3

import (
	"errors"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// A publish binding an alias races a Sweep on another node that moves the
// alias's damaged binding to the quarantine: the Sweep's removal lands
// between the binder's check of the quarantine and its exclusive create.
// The publish must fail with the alias conflict and leave the alias held
// only by the quarantined binding, never bound to a second snapshot.
func TestAliasBindRacingQuarantine(t *testing.T) {
	needServer(t)
	t.Parallel()
	o := testOptions(t, server.Endpoint)
	binder := openWith(t, o)
	other := o
	other.CacheDir = t.TempDir()
	sweeper := openWith(t, other)
	// A released binding: free to take, so the publish's early check passes.
	key := binder.keys.alias("web")
	if _, err := binder.putSmall(bg(), key, encodeBinding("web", ""), putCondition{}); err != nil {
		t.Fatal(err)
	}
	binder.beforeAliasCreate = func() {
		binder.beforeAliasCreate = nil
		flipObject(t, binder, key) // rots while the publish runs
		if err := sweeper.Sweep(bg()); err != nil {
			t.Errorf("sweep: %v", err)
		}
	}
	lease, err := binder.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	_, err = binder.Publish(bg(), lease, repotest.NewInputs(t, repotest.SmallMemoryBytes).Request("web"))
	if !errors.Is(err, repository.ErrAliasConflict) {
		t.Fatalf("publish beside the sweep: %v, want the alias conflict", err)
	}
	if q, err := binder.exists(bg(), binder.keys.quarantinedAlias("web")); err != nil || !q {
		t.Fatalf("quarantined binding: %v, %v", q, err)
	}
	b, _, _, found, err := binder.readAlias(bg(), "web")
	if err != nil || (found && b.ID == lease.SnapshotID()) {
		t.Fatalf("alias in place after the failed publish: %+v found=%v, %v; want none naming %s",
			b, found, err, lease.SnapshotID())
	}
	if _, err := sweeper.Lookup(bg(), "web"); errors.Is(err, repository.ErrNotFound) || err == nil {
		t.Fatalf("Lookup(web) = %v; want the damaged binding reported", err)
	}
}
