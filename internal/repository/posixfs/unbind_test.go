package posixfs

import (
	"errors"
	"os"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestDeleteKeepsAnAliasTakenOverMeanwhile: once a delete has removed the
// record, a binding still naming the id is stale, and a publisher may take
// it over before the delete gets to it. The delete (of a healthy record
// and of one that does not decode) then leaves that binding to its new
// holder, and removes the one nobody took.
func TestDeleteKeepsAnAliasTakenOverMeanwhile(t *testing.T) {
	for _, damaged := range []bool{false, true} {
		name := "healthy"
		if damaged {
			name = "damaged"
		}
		t.Run(name, func(t *testing.T) {
			r := openTemp(t, Options{})
			rec, _ := repotest.Publish(t, r, "mine")
			for _, stray := range []string{"taken", "left"} {
				if err := os.WriteFile(r.paths.aliasPath(stray), []byte(rec.ID+"\n"), catalogFileMode); err != nil {
					t.Fatal(err)
				}
			}
			if damaged {
				repotest.FlipBytes(t, r.paths.recordPath(rec.ID), 0)
			}
			var taker string
			r.faultHook = func(point string) {
				if point == FaultDeleteAfterRecord {
					other, _ := repotest.Publish(t, r, "taken")
					taker = other.ID
				}
			}
			if err := r.Delete(bg(), rec.ID); err != nil {
				t.Fatal(err)
			}
			r.faultHook = nil
			if id, err := r.ResolveAlias(bg(), "taken"); err != nil || id != taker {
				t.Errorf("alias taken over during the delete resolves to %s, %v; want its new holder %s", id, err, taker)
			}
			for _, alias := range []string{"mine", "left"} {
				if id, err := r.readAlias(alias); err != nil || id != "" {
					t.Errorf("alias %s of the deleted snapshot is bound to %q (%v); want unbound", alias, id, err)
				}
			}
		})
	}
}

// TestResolveOfASnapshotDeletedMeanwhile deletes the snapshot between
// Resolve's read of the record and its check of the artifacts: Resolve
// says not found, as it would a moment later, not that the snapshot is
// damaged (a recording resolving it would otherwise report an integrity
// failure for a deletion).
func TestResolveOfASnapshotDeletedMeanwhile(t *testing.T) {
	r := openTemp(t, Options{})
	rec, _ := repotest.Publish(t, r, "")
	r.afterResolveRecord = func(id string) {
		if err := r.Delete(bg(), id); err != nil {
			t.Error(err)
		}
	}
	_, err := r.Resolve(bg(), rec.ID)
	r.afterResolveRecord = nil
	if !errors.Is(err, repository.ErrNotFound) || errors.Is(err, repository.ErrIntegrity) {
		t.Fatalf("Resolve of a snapshot deleted meanwhile: %v; want ErrNotFound alone", err)
	}
}
