package repotest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"warmstart/internal/repository"
)

// Damageable is one store under the damage tests: its repository plus raw
// access that the contract does not offer.
type Damageable struct {
	// Repo is the store opened for writing.
	Repo repository.Repository
	// FlipRecord and FlipAlias change the first byte of the stored record
	// of an id or binding of an alias, as bit rot would.
	FlipRecord func(t *testing.T, id string)
	FlipAlias  func(t *testing.T, alias string)
	// Sweep runs what a writer runs at open (it quarantines damage).
	Sweep func(t *testing.T)
	// ReadOnly opens the same store as the read-only verbs do.
	ReadOnly func(t *testing.T) repository.Repository
	// BoundTo returns the id the stored binding of alias names, "" when
	// there is none (or it is released); Bind stores a binding of alias
	// to id, as a crash between binding and record would leave it.
	BoundTo func(t *testing.T, alias string) string
	Bind    func(t *testing.T, alias, id string)
}

// RunDamage checks how a backend reports, keeps aside and resolves damaged
// catalog entries. open returns a fresh, empty store each time.
func RunDamage(t *testing.T, open func(t *testing.T) Damageable) {
	tests := []struct {
		name string
		fn   func(*testing.T, Damageable)
	}{
		{"DamagedRecordReportedThenQuarantined", testDamagedRecord},
		{"DamagedAliasNeverBoundTwice", testDamagedAlias},
		{"DeleteUnbindsEveryAliasOfTheID", testDeleteUnbindsAliases},
		{"DanglingAliasNamesItsID", testDanglingAlias},
		{"DeleteOfADanglingAliasReleasesIt", testDeleteDanglingAlias},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

// mustDamage returns the store's damage report and checks it names
// exactly one entry of kind and name, quarantined or not as wanted.
func mustDamage(t *testing.T, repo repository.Repository, kind, name string, quarantined bool) {
	t.Helper()
	ds, err := repo.Damaged(bg())
	if err != nil {
		t.Fatalf("Damaged: %v", err)
	}
	if len(ds) != 1 || ds[0].Kind != kind || ds[0].Name != name || ds[0].Quarantined != quarantined || ds[0].Location == "" {
		t.Fatalf("Damaged = %+v; want one %s %s, quarantined=%v", ds, kind, name, quarantined)
	}
}

func mustNoDamage(t *testing.T, repo repository.Repository) {
	t.Helper()
	if ds, err := repo.Damaged(bg()); err != nil || len(ds) != 0 {
		t.Fatalf("Damaged = %+v, %v; want none", ds, err)
	}
}

// publishFails publishes fresh inputs under alias and returns the error.
func publishFails(t *testing.T, repo repository.Repository, alias string) error {
	t.Helper()
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	_, err = repo.Publish(bg(), lease, NewInputs(t, SmallMemoryBytes).Request(alias))
	return err
}

// carrying returns the ids of listed records that carry alias.
func carrying(t *testing.T, repo repository.Repository, alias string) []string {
	t.Helper()
	var out []string
	for _, r := range mustList(t, repo, repository.Filter{}) {
		if r.Alias == alias {
			out = append(out, r.ID)
		}
	}
	return out
}

func testDamagedRecord(t *testing.T, d Damageable) {
	bad, _ := Publish(t, d.Repo, "bad")
	good, _ := Publish(t, d.Repo, "good")
	d.FlipRecord(t, bad.ID)

	if recs := mustList(t, d.Repo, repository.Filter{}); len(recs) != 1 || recs[0].ID != good.ID {
		t.Fatalf("List = %v; want only %s", ids(recs), good.ID)
	}
	mustDamage(t, d.Repo, repository.DamageRecord, bad.ID, false)
	// Reading never moves anything.
	ro := d.ReadOnly(t)
	mustDamage(t, ro, repository.DamageRecord, bad.ID, false)
	mustDamage(t, d.Repo, repository.DamageRecord, bad.ID, false)

	d.Sweep(t)
	mustDamage(t, d.Repo, repository.DamageRecord, bad.ID, true)
	mustDamage(t, ro, repository.DamageRecord, bad.ID, true)
	// A second sweep keeps it (and its artifacts) where it is.
	d.Sweep(t)
	mustDamage(t, d.Repo, repository.DamageRecord, bad.ID, true)
	_, err := d.Repo.Get(bg(), bad.ID)
	wantErr(t, "Get of a quarantined record", err, repository.ErrIntegrity)
	// Its alias stays taken: the quarantined record may carry it.
	wantErr(t, "publish under the alias of a quarantined record", publishFails(t, d.Repo, "bad"), repository.ErrAliasConflict)

	// The operator deletes the id: the entry, its artifacts and the alias go.
	if err := d.Repo.Delete(bg(), bad.ID); err != nil {
		t.Fatalf("Delete(quarantined): %v", err)
	}
	mustNoDamage(t, d.Repo)
	again, _ := Publish(t, d.Repo, "bad")
	if id, err := d.Repo.ResolveAlias(bg(), "bad"); err != nil || id != again.ID {
		t.Fatalf("ResolveAlias after delete = %s, %v; want %s", id, err, again.ID)
	}
}

func testDamagedAlias(t *testing.T, d Damageable) {
	first, _ := Publish(t, d.Repo, "ref")
	d.FlipAlias(t, "ref")

	mustDamage(t, d.Repo, repository.DamageAlias, "ref", false)
	_, err := d.Repo.ResolveAlias(bg(), "ref")
	wantErr(t, "ResolveAlias of a damaged binding", err, repository.ErrIntegrity)
	wantErr(t, "publish under a damaged alias", publishFails(t, d.Repo, "ref"), repository.ErrAliasConflict)

	d.Sweep(t)
	mustDamage(t, d.Repo, repository.DamageAlias, "ref", true)
	_, err = d.Repo.ResolveAlias(bg(), "ref")
	wantErr(t, "ResolveAlias of a quarantined binding", err, repository.ErrIntegrity)
	wantErr(t, "publish under a quarantined alias", publishFails(t, d.Repo, "ref"), repository.ErrAliasConflict)
	if got := carrying(t, d.Repo, "ref"); len(got) != 1 || got[0] != first.ID {
		t.Fatalf("snapshots named ref: %v; want only %s", got, first.ID)
	}

	// Deleting the snapshot whose record carries the alias frees it.
	if err := d.Repo.Delete(bg(), first.ID); err != nil {
		t.Fatal(err)
	}
	mustNoDamage(t, d.Repo)
	second, _ := Publish(t, d.Repo, "ref")
	if got := carrying(t, d.Repo, "ref"); len(got) != 1 || got[0] != second.ID {
		t.Fatalf("snapshots named ref: %v; want only %s", got, second.ID)
	}
}

// testDeleteUnbindsAliases deletes by id a healthy record, a damaged one
// in place and a quarantined one, each with its alias and a stray binding
// naming it: no binding names the id afterwards, both aliases resolve as
// unbound, an alias of another snapshot stays, and the alias can be
// published again.
func testDeleteUnbindsAliases(t *testing.T, d Damageable) {
	keep, _ := Publish(t, d.Repo, "keep")
	for _, state := range []string{"healthy", "damaged", "quarantined"} {
		alias, stray := "snap-"+state, "stray-"+state
		rec, _ := Publish(t, d.Repo, alias)
		d.Bind(t, stray, rec.ID)
		if state != "healthy" {
			d.FlipRecord(t, rec.ID)
		}
		if state == "quarantined" {
			d.Sweep(t)
		}
		if err := d.Repo.Delete(bg(), rec.ID); err != nil {
			t.Fatalf("Delete(%s record): %v", state, err)
		}
		for _, a := range []string{alias, stray} {
			if id := d.BoundTo(t, a); id != "" {
				t.Errorf("after deleting the %s record %s, alias %s is still bound to %s", state, rec.ID, a, id)
			}
			_, err := d.Repo.ResolveAlias(bg(), a)
			wantErr(t, "ResolveAlias of an alias of a deleted snapshot", err, repository.ErrNotFound)
		}
		mustNoDamage(t, d.Repo)
		if listed := ids(mustList(t, d.Repo, repository.Filter{})); slices.Contains(listed, rec.ID) || !slices.Contains(listed, keep.ID) {
			t.Fatalf("List after deleting the %s record %s = %v; want %s and not it", state, rec.ID, listed, keep.ID)
		}
		again, _ := Publish(t, d.Repo, alias)
		if id, err := d.Repo.ResolveAlias(bg(), alias); err != nil || id != again.ID {
			t.Fatalf("ResolveAlias(%s) after republish = %s, %v; want %s", alias, id, err, again.ID)
		}
	}
	if id, err := d.Repo.ResolveAlias(bg(), "keep"); err != nil || id != keep.ID {
		t.Fatalf("ResolveAlias(keep) = %s, %v; want %s", id, err, keep.ID)
	}
}

// testDanglingAlias resolves a binding left naming a snapshot that is
// gone (a crash between a delete's record and its alias): the error is
// ErrNotFound and names both the alias and the missing id.
func testDanglingAlias(t *testing.T, d Damageable) {
	gone, _ := Publish(t, d.Repo, "")
	if err := d.Repo.Delete(bg(), gone.ID); err != nil {
		t.Fatal(err)
	}
	d.Bind(t, "ghost", gone.ID)
	for what, resolve := range map[string]func() error{
		"ResolveAlias": func() error { _, err := d.Repo.ResolveAlias(bg(), "ghost"); return err },
		"Lookup":       func() error { _, err := d.Repo.Lookup(bg(), "ghost"); return err },
	} {
		err := resolve()
		wantErr(t, what+" of a dangling alias", err, repository.ErrNotFound)
		if msg := err.Error(); !strings.Contains(msg, "ghost") || !strings.Contains(msg, gone.ID) {
			t.Errorf("%s of a dangling alias: %q; want the alias and the missing id %s named", what, msg, gone.ID)
		}
	}
}

// testDeleteDanglingAlias deletes by a dangling alias (snapshot delete
// ALIAS): the binding naming the missing snapshot is released and
// DeleteRef says so, other bindings stay, and a second delete, a delete of
// an alias nothing binds and one of a name that is neither an id nor an
// alias say what they are.
func testDeleteDanglingAlias(t *testing.T, d Damageable) {
	gone, _ := Publish(t, d.Repo, "")
	if err := d.Repo.Delete(bg(), gone.ID); err != nil {
		t.Fatal(err)
	}
	keep, _ := Publish(t, d.Repo, "keep")
	d.Bind(t, "ghost", gone.ID)
	del, err := repository.DeleteRef(bg(), d.Repo, "ghost")
	want := repository.Deletion{ID: gone.ID, Alias: "ghost", Released: true}
	if err != nil || del != want {
		t.Fatalf("DeleteRef(ghost) = %+v, %v; want %+v", del, err, want)
	}
	if id := d.BoundTo(t, "ghost"); id != "" {
		t.Fatalf("ghost still bound to %s after its release", id)
	}
	_, err = d.Repo.Lookup(bg(), "ghost")
	var dangling *repository.DanglingAlias
	if !errors.Is(err, repository.ErrNotFound) || errors.As(err, &dangling) {
		t.Fatalf("Lookup(ghost) after the release: %v; want plain not found", err)
	}
	if id, err := d.Repo.ResolveAlias(bg(), "keep"); err != nil || id != keep.ID {
		t.Fatalf("ResolveAlias(keep) = %s, %v; want %s", id, err, keep.ID)
	}
	for _, ref := range []string{"ghost", "never-bound"} {
		if del, err := repository.DeleteRef(bg(), d.Repo, ref); err != nil || !del.Absent {
			t.Fatalf("DeleteRef(%s) = %+v, %v; want nothing to delete", ref, del, err)
		}
	}
	for _, ref := range []string{"Bad/Name", "../etc", ""} {
		_, err := repository.DeleteRef(bg(), d.Repo, ref)
		wantErr(t, fmt.Sprintf("DeleteRef(%q)", ref), err, repository.ErrInvalidRequest)
	}
}
