package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/repotest"
)

// A record with one bad byte is a CORRUPT row of `snapshot list`, in the
// table and in JSON, with a warning; --check exits 1; listing moves
// nothing.
func TestSnapshotListReportsDamagedRecords(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	repo, err := posixfs.Open(store, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	bad, _ := repotest.Publish(t, repo, "bad")
	good, _ := repotest.Publish(t, repo, "good")
	recordPath := filepath.Join(store, "catalog", "records", bad.ID+".json")
	repotest.FlipBytes(t, recordPath, 0)

	table := runCLI(t, "snapshot", "list", "--store", store)
	if table.code != 0 || !strings.Contains(table.stdout, good.ID) || !strings.Contains(table.stdout, bad.ID+"  -      CORRUPT") ||
		!strings.Contains(table.stderr, "corrupt record "+bad.ID) {
		t.Fatalf("list: exit %d\nstdout:\n%s\nstderr:\n%s", table.code, table.stdout, table.stderr)
	}
	checkJSONRows(t, store, good.ID, bad.ID)
	check := runCLI(t, "snapshot", "list", "--store", store, "--check")
	if check.code != 1 || !strings.Contains(check.stderr, "1 damaged catalog entries") {
		t.Fatalf("list --check: exit %d, stderr %q; want exit 1", check.code, check.stderr)
	}
	if _, err := os.Stat(recordPath); err != nil {
		t.Fatalf("listing moved the damaged record: %v", err)
	}
	clean := runCLI(t, "snapshot", "list", "--store", store, "--check", "--alias-prefix", "go")
	if clean.code != 0 {
		t.Fatalf("list --check with a filter that leaves the damage out: exit %d, %s", clean.code, clean.stderr)
	}
}

// checkJSONRows checks `snapshot list --json` lists good, then bad as a
// corrupt record row.
func checkJSONRows(t *testing.T, store, good, bad string) {
	t.Helper()
	js := runCLI(t, "snapshot", "list", "--store", store, "--json")
	var rows []repository.Entry
	if err := json.Unmarshal([]byte(js.stdout), &rows); err != nil || js.code != 0 {
		t.Fatalf("list --json: exit %d, %v\n%s", js.code, err, js.stdout)
	}
	if len(rows) != 2 || rows[0].ID != good || rows[1].ID != bad || rows[1].Corrupt == nil || rows[1].Corrupt.Kind != repository.DamageRecord {
		t.Fatalf("list --json rows = %+v", rows)
	}
}

// A writer quarantines a damaged record; `snapshot delete ID` then lets it
// go, and the catalog checks clean.
func TestDeleteOfAQuarantinedRecord(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	repo, err := posixfs.Open(store, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	bad, lease := repotest.Publish(t, repo, "bad")
	lease.End()
	repotest.FlipBytes(t, filepath.Join(store, "catalog", "records", bad.ID+".json"), 0)
	if _, err := posixfs.Open(store, posixfs.Options{}); err != nil { // a writer's open quarantines
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(store, "catalog", "quarantine", "records", bad.ID+".json")); err != nil {
		t.Fatalf("not quarantined: %v", err)
	}
	del := runCLI(t, "snapshot", "delete", "--store", store, bad.ID)
	if del.code != 0 || !strings.Contains(del.stdout, "deleted snapshot "+bad.ID) {
		t.Fatalf("delete: exit %d, stdout %q, stderr %q", del.code, del.stdout, del.stderr)
	}
	if check := runCLI(t, "snapshot", "list", "--store", store, "--check"); check.code != 0 {
		t.Fatalf("list --check after the delete: exit %d, %s", check.code, check.stderr)
	}
	if _, err := os.Stat(filepath.Join(store, "snapshots", bad.ID)); !os.IsNotExist(err) {
		t.Fatalf("the quarantined record's artifacts remain: %v", err)
	}
	// Its alias went with it: nothing names the deleted id.
	if _, err := os.Stat(filepath.Join(store, "catalog", "aliases", "bad")); !os.IsNotExist(err) {
		t.Fatalf("the deleted record's alias binding remains: %v", err)
	}
	show := runCLI(t, "snapshot", "show", "--store", store, "bad")
	if show.code == 0 || strings.Contains(show.stderr, bad.ID) || !strings.Contains(show.stderr, "not found") {
		t.Fatalf("show of the deleted record's alias: exit %d, stderr %q; want not found, naming no deleted id", show.code, show.stderr)
	}
	if verify := runCLI(t, "snapshot", "verify", "--store", store, "--all"); verify.code != 0 {
		t.Fatalf("verify --all after the delete: exit %d\n%s\n%s", verify.code, verify.stdout, verify.stderr)
	}
}

// A record whose alias is bound to no snapshot, or to another one, is
// marked ALIAS MISMATCH in `snapshot list`, with a warning; --json gives
// the row an alias_mismatch; --check exits 1.
func TestSnapshotListMarksAliasMismatch(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	repo, err := posixfs.Open(store, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	unbound, _ := repotest.Publish(t, repo, "ref")
	bound, _ := repotest.Publish(t, repo, "first")
	holder, _ := repotest.Publish(t, repo, "second")
	retagRecord(t, store, unbound.ID, "ref", "other")
	retagRecord(t, store, bound.ID, "first", "second")

	table := runCLI(t, "snapshot", "list", "--store", store)
	for _, want := range []string{unbound.ID + "  other (ALIAS MISMATCH)", bound.ID + "  second (ALIAS MISMATCH)", holder.ID + "  second   "} {
		if !strings.Contains(table.stdout, want) {
			t.Errorf("list: stdout lacks %q", want)
		}
	}
	if table.code != 0 || !strings.Contains(table.stderr, "warning: alias mismatch: the record of snapshot "+unbound.ID+` carries alias "other", which is bound to no snapshot`) {
		t.Fatalf("list: exit %d\nstdout:\n%s\nstderr:\n%s", table.code, table.stdout, table.stderr)
	}

	js := runCLI(t, "snapshot", "list", "--store", store, "--json")
	var rows []repository.Entry
	if err := json.Unmarshal([]byte(js.stdout), &rows); err != nil || js.code != 0 || len(rows) != 3 {
		t.Fatalf("list --json: exit %d, %v\n%s", js.code, err, js.stdout)
	}
	want := []*repository.AliasMismatch{
		{Alias: "other", ID: unbound.ID, Carries: "other"},
		{Alias: "second", BoundTo: holder.ID, ID: bound.ID, Carries: "second"},
		nil,
	}
	for i, row := range rows {
		if got := row.AliasMismatch; (got == nil) != (want[i] == nil) || got != nil && *got != *want[i] {
			t.Errorf("list --json row %d (%s): alias_mismatch %+v, want %+v", i, row.ID, got, want[i])
		}
	}
	check := runCLI(t, "snapshot", "list", "--store", store, "--check")
	if check.code != 1 || !strings.Contains(check.stderr, "snapshot list --check: 2 alias mismatches") {
		t.Fatalf("list --check: exit %d, stderr %q; want exit 1", check.code, check.stderr)
	}
}
