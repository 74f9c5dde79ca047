package daemon_test

import (
	"context"
	"path/filepath"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// GET /snapshots shows a record that does not decode as a corrupt row and
// logs it, instead of leaving it out.
func TestListShowsDamagedRecords(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	ctx := context.Background()
	imp := r.importAs(t, f, "ref")
	logged := r.log.logged("damaged catalog entry")
	repotest.FlipBytes(t, filepath.Join(f.cfg.Backend.PosixFS.SnapshotStore, "catalog", "records", imp.ID+".json"), 0)

	rows, err := r.client.Catalog(ctx, repository.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != imp.ID || rows[0].Corrupt == nil || rows[0].Corrupt.Kind != repository.DamageRecord {
		t.Fatalf("GET /snapshots = %+v; want one corrupt row for %s", rows, imp.ID)
	}
	select {
	case <-logged:
	default:
		t.Fatal("the damaged record was not logged")
	}
	if recs, err := r.client.Snapshots(ctx, repository.Filter{}); err != nil || len(recs) != 0 {
		t.Fatalf("Snapshots = %+v, %v; want no restorable record", recs, err)
	}
}

// A daemon starting over a damaged catalog logs each damaged entry.
func TestStartLogsDamagedEntries(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	first := startDaemon(t, f, nil)
	first.importAs(t, f, "ref")
	first.d.Shutdown(context.Background())
	repotest.FlipBytes(t, filepath.Join(f.cfg.Backend.PosixFS.SnapshotStore, "catalog", "aliases", "ref"), 0)

	again := startDaemon(t, f, nil)
	select {
	case <-again.log.logged("damaged catalog entry"):
	default:
		t.Fatal("the damaged alias was not logged at start")
	}
}
