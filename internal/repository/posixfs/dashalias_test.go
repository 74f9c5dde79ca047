package posixfs

import (
	"errors"
	"os"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs/posixfstest"
	"warmstart/internal/repository/repotest"
)

// TestAliasStartingWithADashBoundEarlier: builds before the rule against a
// leading '-' bound such aliases. A store holding one still lists it,
// resolves it and deletes its snapshot; only a new binding is refused.
func TestAliasStartingWithADashBoundEarlier(t *testing.T) {
	r := openTemp(t, Options{})
	rec, _ := repotest.Publish(t, r, "")
	const alias = "-x"
	posixfstest.EditRecord(t, r.Root(), rec.ID, func(f map[string]any) { f["alias"] = alias })
	if err := os.WriteFile(r.paths.aliasPath(alias), []byte(rec.ID+"\n"), catalogFileMode); err != nil {
		t.Fatal(err)
	}
	recs, err := r.List(bg(), repository.Filter{})
	if err != nil || len(recs) != 1 || recs[0].Alias != alias {
		t.Fatalf("List = %+v, %v; want the record with alias %s", recs, err, alias)
	}
	if id, err := r.ResolveAlias(bg(), alias); err != nil || id != rec.ID {
		t.Fatalf("ResolveAlias(%s) = %s, %v; want %s", alias, id, err, rec.ID)
	}
	if got, err := r.Lookup(bg(), alias); err != nil || got.ID != rec.ID {
		t.Fatalf("Lookup(%s) = %s, %v; want %s", alias, got.ID, err, rec.ID)
	}
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	if _, err := r.Publish(bg(), lease, in.Request("-y")); !errors.Is(err, repository.ErrInvalidRequest) {
		t.Fatalf("Publish with alias -y = %v, want ErrInvalidRequest", err)
	}
	if err := r.Delete(bg(), rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ResolveAlias(bg(), alias); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("ResolveAlias(%s) after the delete = %v, want ErrNotFound", alias, err)
	}
}
