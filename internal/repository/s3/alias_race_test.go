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
	lease := beginCapture(t, binder)
	_, err := binder.Publish(bg(), lease, repotest.NewInputs(t, repotest.SmallMemoryBytes).Request("web"))
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

// Two nodes delete snapshot X (alias web) at once; the per-id lock holds
// only within a process. Node B reads web → X; meanwhile node A finishes
// its delete, and a publisher binds web to its new snapshot Y. B's release
// of web must then leave Y's binding alone: only a binding still naming X
// is released, on the ETag B read.
func TestDeleteOnTwoNodesKeepsANewBindingOfTheAlias(t *testing.T) {
	needServer(t)
	t.Parallel()
	o := testOptions(t, server.Endpoint)
	nodeA := openWith(t, o)
	other := o
	other.CacheDir = t.TempDir()
	nodeB := openWith(t, other)
	x, xLease := repotest.Publish(t, nodeA, "web")
	xLease.End()
	var y repository.Record
	nodeB.beforeAliasRelease = func(string) {
		nodeB.beforeAliasRelease = nil
		if err := nodeA.Delete(bg(), x.ID); err != nil {
			t.Errorf("delete on node A: %v", err)
		}
		var yLease repository.Lease
		y, yLease = repotest.Publish(t, nodeA, "web")
		yLease.End()
	}
	if err := nodeB.Delete(bg(), x.ID); err != nil {
		t.Fatalf("delete on node B: %v", err)
	}
	if y.ID == "" {
		t.Fatal("the republish between the read and the release did not run")
	}
	for _, node := range []*Repo{nodeA, nodeB} {
		if got, err := node.ResolveAlias(bg(), "web"); err != nil || got != y.ID {
			t.Fatalf("web after both deletes = %s, %v; want %s (the new binding)", got, err, y.ID)
		}
	}
	rows, _, err := repository.Listing(bg(), nodeB, repository.Filter{})
	if err != nil || len(rows) != 1 || rows[0].ID != y.ID || rows[0].Alias != "web" {
		t.Fatalf("listing after both deletes: %+v, %v; want only %s (web)", rows, err, y.ID)
	}
}

// A delete leaves the alias's binding released, not removed (S3 has no
// conditional DELETE): a released binding is no alias. It is not listed,
// resolves to nothing, and the next publisher of the alias takes it over.
func TestReleasedBindingIsFreeAndUnlisted(t *testing.T) {
	r := openRepo(t)
	x, lease := repotest.Publish(t, r, "web")
	lease.End()
	if err := r.Delete(bg(), x.ID); err != nil {
		t.Fatal(err)
	}
	b, _, _, found, err := r.readAlias(bg(), "web")
	if err != nil || !found || b.ID != "" {
		t.Fatalf("binding after delete: %+v found=%v, %v; want a released one", b, found, err)
	}
	if _, err := r.ResolveAlias(bg(), "web"); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("ResolveAlias(web) of a released binding: %v, want not found", err)
	}
	if rows, damaged, err := repository.Listing(bg(), r, repository.Filter{}); err != nil || len(rows) != 0 || len(damaged) != 0 {
		t.Fatalf("listing with a released binding: %+v, %+v, %v; want nothing", rows, damaged, err)
	}
	y, lease := repotest.Publish(t, r, "web")
	lease.End()
	if got, err := r.ResolveAlias(bg(), "web"); err != nil || got != y.ID {
		t.Fatalf("web after a new publish = %s, %v; want %s", got, err, y.ID)
	}
}

// snapshot delete of a dangling alias on S3: a binding naming a missing
// snapshot that is younger than AliasBindGrace may be a publish's that has
// not written its record yet, so it is kept (an alias conflict naming it),
// unless the snapshot's tombstone shows it was published and deleted; one
// re-pointed between the release's read and its write stays its new
// holder's.
func TestDeleteOfADanglingAliasKeepsWhatIsNotItsOwn(t *testing.T) {
	r := openRepo(t)
	gone, lease := repotest.Publish(t, r, "")
	lease.End()
	if err := r.Delete(bg(), gone.ID); err != nil {
		t.Fatal(err)
	}
	bind := func(id string) {
		if _, err := r.putSmall(bg(), r.keys.alias("ghost"), encodeBinding("ghost", id), putCondition{}); err != nil {
			t.Fatal(err)
		}
	}
	unpublished, err := repository.NewID()
	if err != nil {
		t.Fatal(err)
	}
	bind(unpublished)
	_, err = repository.DeleteRef(bg(), r, "ghost")
	var conflict *repository.AliasConflictError
	if !errors.As(err, &conflict) || conflict.HolderID != unpublished || errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("delete of a young dangling alias: %v; want an alias conflict naming %s", err, unpublished)
	}
	bind(gone.ID)
	if _, err := repository.DeleteRef(bg(), r, "ghost"); err != nil {
		t.Fatalf("delete of a young alias naming a deleted snapshot: %v; want it released", err)
	}
	if _, err := r.ResolveAlias(bg(), "ghost"); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("ghost after its release: %v; want not found", err)
	}

	bind(gone.ID)
	r.aliasGrace = 0
	var newer repository.Record
	r.beforeAliasRelease = func(string) {
		r.beforeAliasRelease = nil
		var l repository.Lease
		newer, l = repotest.Publish(t, r, "ghost") // takes the dangling binding over
		l.End()
	}
	_, err = repository.DeleteRef(bg(), r, "ghost")
	if !errors.As(err, &conflict) || newer.ID == "" || conflict.HolderID != newer.ID {
		t.Fatalf("delete of a dangling alias re-pointed meanwhile: %v; want an alias conflict naming %s", err, newer.ID)
	}
	if id, err := r.ResolveAlias(bg(), "ghost"); err != nil || id != newer.ID {
		t.Fatalf("ghost after the delete = %s, %v; want %s", id, err, newer.ID)
	}
}

// A listing taken in the middle of a delete, just after the alias was
// released, sees a catalog that agrees with itself: the record went first,
// so no record carries an alias bound to nothing (which listing, verify
// --all and list --check report as an alias/record mismatch).
func TestDeleteNeverLeavesARecordCarryingAReleasedAlias(t *testing.T) {
	r := openRepo(t)
	x, lease := repotest.Publish(t, r, "web")
	lease.End()
	looked := false
	r.afterAliasRelease = func(string) {
		r.afterAliasRelease = nil
		looked = true
		rows, _, err := repository.Listing(bg(), r, repository.Filter{})
		if err != nil {
			t.Errorf("listing during the delete: %v", err)
		}
		for _, row := range rows {
			if row.AliasMismatch != nil {
				t.Errorf("listing during the delete of %s reports %v", x.ID, row.AliasMismatch)
			}
		}
	}
	if err := r.Delete(bg(), x.ID); err != nil {
		t.Fatal(err)
	}
	if !looked {
		t.Fatal("the delete released no binding")
	}
}
