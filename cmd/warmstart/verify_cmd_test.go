package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/posixfs/posixfstest"
	"warmstart/internal/repository/repotest"
)

// verifyStore is a store with published snapshots, for verify to run on
// in a child process.
type verifyStore struct {
	dir  string
	repo *posixfs.Repo
}

func newVerifyStore(t *testing.T) *verifyStore {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	repo, err := posixfs.Open(dir, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &verifyStore{dir: dir, repo: repo}
}

// publish publishes a 3 MiB snapshot (three read units) and returns its
// record and the path of its stored memory file.
func (s *verifyStore) publish(t *testing.T, alias string) (repository.Record, string) {
	t.Helper()
	rec, lease := repotest.PublishInputs(t, s.repo, repotest.NewInputs(t, 3<<20), alias)
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	return rec, filepath.Join(s.dir, "snapshots", rec.ID, repository.MemoryFileName)
}

func (s *verifyStore) verify(t *testing.T, args ...string) cliRun {
	t.Helper()
	return runCLI(t, append([]string{"snapshot", "verify", "--store", s.dir}, args...)...)
}

// verifyJSON is the part of the JSON report the tests read.
type verifyJSON struct {
	ID         string `json:"id"`
	OK         bool   `json:"ok"`
	Unverified bool   `json:"unverified"`
	Artifacts  []struct {
		Name     string `json:"name"`
		Status   string `json:"status"`
		Problems []struct {
			Kind string `json:"kind"`
		} `json:"problems"`
		Blocks *struct {
			Checked   int64 `json:"checked"`
			Bad       int64 `json:"bad"`
			BadRanges []struct {
				Offset int64 `json:"offset"`
				Length int64 `json:"length"`
			} `json:"bad_ranges"`
		} `json:"blocks"`
	} `json:"artifacts"`
}

func TestSnapshotVerifyCleanAndFlipped(t *testing.T) {
	s := newVerifyStore(t)
	rec, mem := s.publish(t, "web")
	r := s.verify(t, "web")
	if r.code != 0 || !strings.Contains(r.stdout, "snapshot "+rec.ID+" (alias web): ok") {
		t.Fatalf("clean snapshot: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stderr, "verifying "+rec.ID) || !strings.Contains(r.stderr, "memory.bin: verify 3.0 MiB of 3.0 MiB") {
		t.Errorf("progress on stderr: %q", r.stderr)
	}

	repotest.FlipBytes(t, mem, 2<<20+4096+1)
	r = s.verify(t, rec.ID)
	if r.code != 1 || !strings.Contains(r.stdout, "offset 2101248 (0x201000), 4096 bytes (1 block)") ||
		!strings.Contains(r.stdout, "sha256: the bytes hash to") || !strings.Contains(r.stderr, "problems found") {
		t.Fatalf("flipped byte: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	checkFlippedBlockJSON(t, s, rec.ID)
}

// checkFlippedBlockJSON: verify --json of snapshot id, whose memory has one
// flipped byte in the block at 2 MiB + 4 KiB, exits 1 naming that block.
func checkFlippedBlockJSON(t *testing.T, s *verifyStore, id string) {
	t.Helper()
	r := s.verify(t, id, "--json")
	var rep verifyJSON
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 1 {
		t.Fatalf("--json: exit %d, %v: %q", r.code, err, r.stdout)
	}
	b := rep.Artifacts[1].Blocks
	if rep.OK || rep.Artifacts[1].Name != repository.MemoryFileName || b == nil || b.Bad != 1 ||
		b.BadRanges[0].Offset != 2<<20+4096 || b.BadRanges[0].Length != 4096 {
		t.Fatalf("--json report: %+v", rep)
	}
}

// TestSnapshotVerifyDamagedArtifacts: a truncated or removed artifact is a
// problem (exit 1), never a crash.
func TestSnapshotVerifyDamagedArtifacts(t *testing.T) {
	s := newVerifyStore(t)
	truncated, mem := s.publish(t, "")
	if err := os.Chmod(mem, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(mem, 1<<20); err != nil {
		t.Fatal(err)
	}
	removed, _ := s.publish(t, "")
	if err := os.Remove(filepath.Join(s.dir, "snapshots", removed.ID, repository.DigestsFileName)); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{truncated.ID: "memory.bin            bad", removed.ID: "memory.digests        bad"} {
		r := s.verify(t, id)
		if r.code != 1 || !strings.Contains(r.stdout, want) || strings.Contains(r.stderr, "panic") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1 and %q", id, r.code, r.stdout, r.stderr, want)
		}
	}
}

// TestSnapshotVerifyAddDigests: a legacy snapshot is unverified (exit 0);
// --add-digests gives it a table a later verify checks blocks against; and
// is refused once its memory no longer matches its record.
func TestSnapshotVerifyAddDigests(t *testing.T) {
	s := newVerifyStore(t)
	rec, mem := s.publish(t, "old")
	posixfstest.StripDigests(t, s.dir, rec.ID)
	if r := s.verify(t, "old"); r.code != 0 || !strings.Contains(r.stdout, "ok, unverified (no digest table)") {
		t.Fatalf("legacy: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := s.verify(t, "old", "--add-digests"); r.code != 0 || !strings.Contains(r.stdout, "ok, digest table added") {
		t.Fatalf("--add-digests: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r := s.verify(t, "old", "--json")
	var rep verifyJSON
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 0 || !rep.OK || rep.Unverified ||
		rep.Artifacts[1].Blocks == nil || rep.Artifacts[1].Blocks.Checked != 768 {
		t.Fatalf("after --add-digests: exit %d, %v, %+v", r.code, err, rep)
	}

	posixfstest.StripDigests(t, s.dir, rec.ID)
	repotest.FlipBytes(t, mem, 100)
	r = s.verify(t, "old", "--add-digests")
	if r.code != 1 || !strings.Contains(r.stdout, "not_added: digest table not added: memory.bin does not match the record's SHA-256") {
		t.Fatalf("--add-digests over changed memory: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if got, err := s.repo.Get(context.Background(), rec.ID); err != nil || got.MemoryDigests != nil {
		t.Fatalf("refused --add-digests left %+v, %v", got.MemoryDigests, err)
	}
}

func TestSnapshotVerifyAll(t *testing.T) {
	s := newVerifyStore(t)
	if r := s.verify(t, "--all"); r.code != 0 || !strings.Contains(r.stdout, "no snapshots to verify") {
		t.Fatalf("empty store: exit %d, stdout %q", r.code, r.stdout)
	}
	a, _ := s.publish(t, "a")
	b, mem := s.publish(t, "")
	c, _ := s.publish(t, "c")
	repotest.FlipBytes(t, mem, 0)
	r := s.verify(t, "--all", "--json")
	var reps []verifyJSON
	if err := json.Unmarshal([]byte(r.stdout), &reps); err != nil || r.code != 1 || len(reps) != 3 {
		t.Fatalf("--all --json: exit %d, %v, %q", r.code, err, r.stdout)
	}
	for i, want := range []repository.Record{a, b, c} {
		if reps[i].ID != want.ID || reps[i].OK != (want.ID != b.ID) {
			t.Errorf("report %d: %s ok=%t", i, reps[i].ID, reps[i].OK)
		}
	}
	if !strings.Contains(r.stderr, "1 of 3 snapshots have problems") {
		t.Errorf("stderr %q", r.stderr)
	}
}

func TestSnapshotVerifyUsage(t *testing.T) {
	s := newVerifyStore(t)
	s.publish(t, "web")
	for _, args := range [][]string{{}, {"web", "--all"}, {"web", "other"}, {"--frobnicate", "web"}, {"bad/alias"}} {
		if r := s.verify(t, args...); r.code != 2 || r.stdout != "" {
			t.Errorf("verify %q: exit %d, stdout %q, stderr %q; want a usage error", args, r.code, r.stdout, r.stderr)
		}
	}
	if r := s.verify(t, "nobody"); r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("unknown alias: exit %d, stderr %q", r.code, r.stderr)
	}
	r := runCLI(t, "snapshot", "verify", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "--add-digests") || !strings.Contains(r.stdout, "unverified (no digest table)") {
		t.Errorf("--help: exit %d, stdout %q", r.code, r.stdout)
	}
}

// A bad alias binding is a problem of the snapshot the operator asked
// for: the last line names that ref, not "-" (no record decoded, so the
// report has no id).
func TestSnapshotVerifyBadAliasNamesRef(t *testing.T) {
	s := newVerifyStore(t)
	rec, _ := s.publish(t, "ref")
	alias := filepath.Join(s.dir, "catalog", "aliases", "ref")
	if err := os.WriteFile(alias, []byte("../records/"+rec.ID), 0o644); err != nil {
		t.Fatal(err)
	}
	r := s.verify(t, "ref")
	if r.code != 1 || !strings.Contains(r.stderr, "snapshot verify ref: problems found") {
		t.Fatalf("bad alias: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// An alias binding naming a record that carries another alias is damage
// verify reports, naming the alias, the id and what the record carries,
// not a bare "not found".
func TestSnapshotVerifyAliasRecordMismatch(t *testing.T) {
	s := newVerifyStore(t)
	rec, _ := s.publish(t, "ref")
	retagRecord(t, s.dir, rec.ID, "ref", "other")
	r := s.verify(t, "ref")
	want := "alias ref names snapshot " + rec.ID + `, whose record carries alias "other"`
	if r.code != 1 || !strings.Contains(r.stdout, want) || !strings.Contains(r.stderr, "snapshot verify ref: problems found") {
		t.Fatalf("mismatch: exit %d, stdout %q, stderr %q; want %q", r.code, r.stdout, r.stderr, want)
	}
}

// retagRecord edits the record of id in the POSIX store at dir to carry
// alias to instead of from, leaving the alias bindings as they are: the
// catalog then contradicts itself.
func retagRecord(t *testing.T, dir, id, from, to string) {
	t.Helper()
	path := filepath.Join(dir, "catalog", "records", id+".json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(data), `"alias": "`+from+`"`, `"alias": "`+to+`"`, 1)
	if edited == string(data) {
		t.Fatalf("record %s has no alias field %q to edit: %s", path, from, data)
	}
	if err := os.WriteFile(path, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
}

// verify --all reaches snapshots through their records: one whose record
// carries an alias bound to no snapshot, and one whose record carries an
// alias bound to another snapshot, are problems (exit 1) named in the
// report, as verify ALIAS reports the binding's side.
func TestSnapshotVerifyAllAliasRecordMismatch(t *testing.T) {
	s := newVerifyStore(t)
	unbound, _ := s.publish(t, "ref")
	bound, _ := s.publish(t, "first")
	holder, _ := s.publish(t, "second")
	retagRecord(t, s.dir, unbound.ID, "ref", "other")
	retagRecord(t, s.dir, bound.ID, "first", "second")
	r := s.verify(t, "--all")
	for _, want := range []string{
		"the record of snapshot " + unbound.ID + ` carries alias "other", which is bound to no snapshot`,
		"the record of snapshot " + bound.ID + ` carries alias "second", which is bound to snapshot ` + holder.ID,
		"snapshot " + holder.ID + " (alias second): ok",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("verify --all: stdout lacks %q", want)
		}
	}
	if r.code != 1 || !strings.Contains(r.stderr, "snapshot verify --all: 2 of 3 snapshots have problems") {
		t.Fatalf("verify --all: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	js := s.verify(t, "--all", "--json")
	var reps []struct {
		ID       string `json:"id"`
		OK       bool   `json:"ok"`
		Problems []struct {
			Kind string `json:"kind"`
		} `json:"problems"`
	}
	if err := json.Unmarshal([]byte(js.stdout), &reps); err != nil || js.code != 1 || len(reps) != 3 {
		t.Fatalf("verify --all --json: exit %d, %v, %q", js.code, err, js.stdout)
	}
	if rep := reps[0]; rep.ID != unbound.ID || rep.OK || len(rep.Problems) != 1 || rep.Problems[0].Kind != "alias" {
		t.Errorf("verify --all --json: report of %s = %+v; want one problem of kind alias", unbound.ID, rep)
	}
}
