package repotest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"warmstart/internal/integrity"
	"warmstart/internal/layout"
	"warmstart/internal/repository"
)

// AttachDeleteRaceIterations is how often Run races AttachManifest against
// Delete. Backends add longer, backend-specific races of their own.
const AttachDeleteRaceIterations = 50

// Run checks every behaviour of the repository contract that a backend
// must show within one process. open must return a fresh, empty repository
// each time it is called; the checks run in parallel, each on its own
// repository.
func Run(t *testing.T, open func(t *testing.T) repository.Repository) {
	tests := []struct {
		name string
		fn   func(*testing.T, repository.Repository)
	}{
		{"BeginCaptureIssuesUUIDv7Leases", testBeginCapture},
		{"PublishThenRead", testPublishThenRead},
		{"PublishLargeMemory", testPublishLarge},
		{"PublishStoresDigestTable", testDigestTable},
		{"PublishWithoutAlias", testPublishWithoutAlias},
		{"PublishRejectsBadRequests", testPublishRejects},
		{"PublishRefusedAfterLeaseEnded", testPublishAfterEnd},
		{"PublishTwiceRefused", testPublishTwice},
		{"ForeignLeaseRefused", testForeignLease},
		{"PublishReportsProgress", testProgress},
		{"PublishHonoursCancelledContext", testPublishCancelled},
		{"AliasConflict", testAliasConflict},
		{"AliasReusableAfterDelete", testAliasReuse},
		{"ConcurrentAliasPublishersOneWins", testConcurrentAlias},
		{"DeleteIsIdempotent", testDeleteIdempotent},
		{"InvalidIDsRejected", testInvalidIDs},
		{"InvalidAliasesRejected", testInvalidAliases},
		{"ListFilter", testListFilter},
		{"AttachManifest", testAttach},
		{"AttachRefused", testAttachRefused},
		{"AttachDigests", testAttachDigests},
		{"AttachDigestsRefused", testAttachDigestsRefused},
		{"AttachRefinement", testAttachRefinement},
		{"AttachRefinementRefused", testAttachRefinementRefused},
		{"LeaseExisting", testLeaseExisting},
		{"LeaseHeldAndManifestRequested", testLeaseHeld},
		{"ClaimLease", testClaimLease},
		{"EndWaitsForAttach", testEndWaitsForAttach},
		{"AttachRacingDelete", testAttachRacingDelete},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

func bg() context.Context { return context.Background() }

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want %v", what, err, target)
	}
}

func mustList(t *testing.T, repo repository.Repository, f repository.Filter) []repository.Record {
	t.Helper()
	recs, err := repo.List(bg(), f)
	if err != nil {
		t.Fatalf("List(%+v): %v", f, err)
	}
	return recs
}

func ids(recs []repository.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

func testBeginCapture(t *testing.T, repo repository.Repository) {
	a, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	b, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []repository.Lease{a, b} {
		if err := repository.ValidateID(l.SnapshotID()); err != nil {
			t.Errorf("lease id: %v", err)
		}
	}
	if a.SnapshotID() == b.SnapshotID() {
		t.Fatalf("two captures got the same id %s", a.SnapshotID())
	}
	if a.SnapshotID() > b.SnapshotID() {
		t.Errorf("ids do not sort by creation: %s then %s", a.SnapshotID(), b.SnapshotID())
	}
	select {
	case <-a.Done():
		t.Fatal("Done closed before End")
	default:
	}
	if err := a.End(); err != nil {
		t.Fatal(err)
	}
	if err := a.End(); err != nil {
		t.Fatalf("second End: %v", err)
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("Done not closed after End")
	}
	if err := b.End(); err != nil {
		t.Fatal(err)
	}
	if recs := mustList(t, repo, repository.Filter{}); len(recs) != 0 {
		t.Fatalf("captures without publish are listed: %v", ids(recs))
	}
}

func checkRecordMatches(t *testing.T, rec repository.Record, in Inputs, id, alias string) {
	t.Helper()
	switch {
	case rec.ID != id:
		t.Errorf("record id %s, want %s", rec.ID, id)
	case rec.Alias != alias:
		t.Errorf("record alias %q, want %q", rec.Alias, alias)
	case rec.MemorySize != in.MemorySize || rec.MemorySHA256 != in.MemorySHA256:
		t.Errorf("memory %d/%s, want %d/%s", rec.MemorySize, rec.MemorySHA256, in.MemorySize, in.MemorySHA256)
	case rec.VMStateSize != in.VMStateSize || rec.VMStateSHA256 != in.VMStateSHA256:
		t.Errorf("vm state %d/%s, want %d/%s", rec.VMStateSize, rec.VMStateSHA256, in.VMStateSize, in.VMStateSHA256)
	case !rec.Layout.Equal(in.Layout):
		t.Errorf("layout %v, want %v", rec.Layout, in.Layout)
	case rec.Format != repository.RecordFormatVersion:
		t.Errorf("format %d", rec.Format)
	}
	if err := rec.Validate(); err != nil {
		t.Errorf("record does not validate: %v", err)
	}
}

func testPublishThenRead(t *testing.T, repo repository.Repository) {
	in := NewInputs(t, SmallMemoryBytes)
	// Two regions, to see the layout survive the round trip.
	in.Layout = layout.Layout{FileSize: in.MemorySize, Regions: []layout.Region{
		{Offset: 0, Size: 16 << 10, PageSize: 4096},
		{Offset: 32 << 10, Size: 32 << 10, PageSize: 4096},
	}}
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	before := time.Now()
	rec, err := repo.Publish(bg(), lease, in.Request("web"))
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	checkRecordMatches(t, rec, in, lease.SnapshotID(), "web")
	if rec.CreatedAt.Before(before.Add(-time.Second)) || rec.CreatedAt.After(after.Add(time.Second)) {
		t.Errorf("created at %v, publish ran %v..%v", rec.CreatedAt, before, after)
	}
	if rec.Manifest != nil {
		t.Errorf("fresh record has a manifest: %+v", rec.Manifest)
	}
	checkReadsBack(t, repo, rec, in)
	checkResolves(t, repo, rec, in)
}

// checkReadsBack: the record of a publish of in under alias web reads
// back by id and alias, and is the only one listed.
func checkReadsBack(t *testing.T, repo repository.Repository, rec repository.Record, in Inputs) {
	t.Helper()
	got, err := repo.Get(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	checkRecordMatches(t, got, in, rec.ID, "web")
	if !got.CreatedAt.Equal(rec.CreatedAt) {
		t.Errorf("Get created at %v, Publish said %v", got.CreatedAt, rec.CreatedAt)
	}
	for _, ref := range []string{rec.ID, "web"} {
		got, err := repo.Lookup(bg(), ref)
		if err != nil || got.ID != rec.ID {
			t.Errorf("Lookup(%s) = %s, %v", ref, got.ID, err)
		}
	}
	if id, err := repo.ResolveAlias(bg(), "web"); err != nil || id != rec.ID {
		t.Errorf("ResolveAlias = %s, %v", id, err)
	}
	if recs := mustList(t, repo, repository.Filter{}); len(recs) != 1 || recs[0].ID != rec.ID {
		t.Errorf("List = %v", ids(recs))
	}
}

// checkResolves: a published snapshot resolves to artifacts with in's
// bytes and layout, which stay when the caller removes its input files.
func checkResolves(t *testing.T, repo repository.Repository, rec repository.Record, in Inputs) {
	t.Helper()
	res, err := repo.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ResolvedMemorySHA256(t, res) != in.MemorySHA256 || FileSHA256(t, res.VMStatePath) != in.VMStateSHA256 {
		t.Error("resolved artifacts differ from the inputs")
	}
	if res.ManifestPath != "" {
		t.Errorf("manifest path %q without a manifest", res.ManifestPath)
	}
	if !res.Record.Layout.Equal(in.Layout) {
		t.Errorf("resolved layout %v", res.Record.Layout)
	}
	// The caller may remove its files once Publish returned.
	if err := os.Remove(in.MemoryPath); err != nil {
		t.Fatal(err)
	}
	if ResolvedMemorySHA256(t, res) != in.MemorySHA256 {
		t.Error("stored memory changed when the input was removed")
	}
}

// testDigestTable checks that Publish stores the memory file's per-block
// digest tables (CRC-32C and SHA-256), describes them in the record, and
// that Resolve hands out tables that match both their descriptors and
// the memory.
func testDigestTable(t *testing.T, repo repository.Repository) {
	in := NewInputs(t, LargeMemoryBytes)
	rec, lease := PublishInputs(t, repo, in, "")
	lease.End()
	res, err := repo.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		alg  integrity.Algorithm
		d    *repository.DigestsDescriptor
		path string
	}{{integrity.CRC32C, rec.MemoryDigests, res.DigestsPath}, {integrity.SHA256, rec.MemorySHA256Digests, res.SHA256DigestsPath}} {
		if c.d == nil || c.d.Algorithm != string(c.alg) || c.path == "" {
			t.Fatalf("published record's %s table: %+v at %q", c.alg, c.d, c.path)
		}
		if err := rec.Validate(); err != nil {
			t.Fatalf("record: %v", err)
		}
		data, err := os.ReadFile(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := repository.DescribeDigests(data); got != *c.d {
			t.Fatalf("stored %s table is %+v, record says %+v", c.alg, got, *c.d)
		}
		table, err := integrity.Decode(data, rec.MemorySize)
		if err != nil {
			t.Fatal(err)
		}
		fresh, err := integrity.Decode(tableOf(t, c.alg, in.MemoryPath), rec.MemorySize)
		if err != nil {
			t.Fatal(err)
		}
		if bad := table.Mismatches(fresh); len(bad) != 0 {
			t.Fatalf("stored %s table disagrees with the memory at %d blocks, first at %d", c.alg, len(bad), bad[0])
		}
	}
}

func testPublishLarge(t *testing.T, repo repository.Repository) {
	in := NewInputs(t, LargeMemoryBytes)
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	rec, err := repo.Publish(bg(), lease, in.Request(""))
	if err != nil {
		t.Fatal(err)
	}
	checkRecordMatches(t, rec, in, lease.SnapshotID(), "")
	res, err := repo.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if ResolvedMemorySHA256(t, res) != in.MemorySHA256 {
		t.Error("stored memory differs from the input")
	}
}

func testPublishWithoutAlias(t *testing.T, repo repository.Repository) {
	rec, _ := Publish(t, repo, "")
	if rec.Alias != "" {
		t.Fatalf("alias %q", rec.Alias)
	}
	if _, err := repo.Lookup(bg(), rec.ID); err != nil {
		t.Fatal(err)
	}
	_, err := repo.ResolveAlias(bg(), "nobody")
	wantErr(t, "ResolveAlias(unbound)", err, repository.ErrNotFound)
	_, err = repo.Lookup(bg(), "nobody")
	wantErr(t, "Lookup(unbound)", err, repository.ErrNotFound)
}

func testPublishRejects(t *testing.T, repo repository.Repository) {
	in := NewInputs(t, SmallMemoryBytes)
	dir := t.TempDir()
	empty := dir + "/empty"
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func(*repository.PublishRequest)
	}{
		{"bad alias", func(r *repository.PublishRequest) { r.Alias = "../x" }},
		{"missing vm state", func(r *repository.PublishRequest) { r.VMStatePath = dir + "/nope" }},
		{"missing memory", func(r *repository.PublishRequest) { r.MemoryPath = dir + "/nope" }},
		{"empty vm state path", func(r *repository.PublishRequest) { r.VMStatePath = "" }},
		{"memory is a directory", func(r *repository.PublishRequest) { r.MemoryPath = dir }},
		{"empty vm state", func(r *repository.PublishRequest) { r.VMStatePath = empty }},
		// procfs files stat as 0 bytes (or 4096 on sysfs) and read as more.
		{"vm state on procfs", func(r *repository.PublishRequest) { r.VMStatePath = "/proc/self/environ" }},
		{"memory on procfs", func(r *repository.PublishRequest) { r.MemoryPath = "/proc/self/environ" }},
		{"layout for another size", func(r *repository.PublishRequest) { r.Layout = layout.Single(2 * SmallMemoryBytes) }},
		{"zero layout", func(r *repository.PublishRequest) { r.Layout = layout.Layout{} }},
		{"region past the file", func(r *repository.PublishRequest) {
			r.Layout = layout.Layout{FileSize: SmallMemoryBytes, Regions: []layout.Region{{Offset: 4096, Size: SmallMemoryBytes, PageSize: 4096}}}
		}},
	}
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	for _, tc := range cases {
		req := in.Request("ok")
		tc.edit(&req)
		_, err := repo.Publish(bg(), lease, req)
		wantErr(t, tc.name, err, repository.ErrInvalidRequest)
	}
	if recs := mustList(t, repo, repository.Filter{}); len(recs) != 0 {
		t.Fatalf("rejected publishes left records: %v", ids(recs))
	}
	_, err = repo.ResolveAlias(bg(), "ok")
	wantErr(t, "alias after rejected publishes", err, repository.ErrNotFound)
	// Rejections do not spoil the lease.
	rec, err := repo.Publish(bg(), lease, in.Request("ok"))
	if err != nil {
		t.Fatalf("publish after rejections: %v", err)
	}
	checkRecordMatches(t, rec, in, lease.SnapshotID(), "ok")
}

func testPublishAfterEnd(t *testing.T, repo repository.Repository) {
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	_, err = repo.Publish(bg(), lease, NewInputs(t, SmallMemoryBytes).Request("late"))
	wantErr(t, "Publish after End", err, repository.ErrLeaseEnded)
	_, err = repo.Get(bg(), lease.SnapshotID())
	wantErr(t, "Get after refused publish", err, repository.ErrNotFound)
	_, err = repo.ResolveAlias(bg(), "late")
	wantErr(t, "alias after refused publish", err, repository.ErrNotFound)
}

func testPublishTwice(t *testing.T, repo repository.Repository) {
	rec, lease := Publish(t, repo, "once")
	_, err := repo.Publish(bg(), lease, NewInputs(t, SmallMemoryBytes).Request("twice"))
	wantErr(t, "second Publish", err, repository.ErrInvalidRequest)
	got, err := repo.Get(bg(), rec.ID)
	if err != nil || got.Alias != "once" || got.MemorySHA256 != rec.MemorySHA256 {
		t.Fatalf("second publish changed the record: %+v, %v", got, err)
	}
	_, err = repo.ResolveAlias(bg(), "twice")
	wantErr(t, "alias of refused publish", err, repository.ErrNotFound)
}

// strangerLease is a lease no repository issued.
type strangerLease struct{ id string }

func (l strangerLease) SnapshotID() string    { return l.id }
func (l strangerLease) Done() <-chan struct{} { return nil }
func (l strangerLease) End() error            { return nil }

func testForeignLease(t *testing.T, repo repository.Repository) {
	rec, _ := Publish(t, repo, "")
	stranger := strangerLease{id: rec.ID}
	_, err := repo.Publish(bg(), stranger, NewInputs(t, SmallMemoryBytes).Request(""))
	wantErr(t, "Publish with a foreign lease", err, repository.ErrInvalidRequest)
	_, err = repo.AttachManifest(bg(), stranger, []byte("m"), nil)
	wantErr(t, "AttachManifest with a foreign lease", err, repository.ErrInvalidRequest)
	_, err = repo.AttachManifest(bg(), nil, []byte("m"), nil)
	wantErr(t, "AttachManifest with a nil lease", err, repository.ErrInvalidRequest)
}

func testProgress(t *testing.T, repo repository.Repository) {
	in := NewInputs(t, LargeMemoryBytes)
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	last := map[string]repository.ImportProgress{}
	req := in.Request("")
	req.Progress = func(p repository.ImportProgress) {
		if prev, ok := last[p.Artifact]; ok && prev.Step == p.Step && p.DoneBytes < prev.DoneBytes {
			t.Errorf("progress went back: %+v after %+v", p, prev)
		}
		last[p.Artifact] = p
	}
	if _, err := repo.Publish(bg(), lease, req); err != nil {
		t.Fatal(err)
	}
	for name, size := range map[string]int64{repository.MemoryFileName: in.MemorySize, repository.VMStateFileName: in.VMStateSize} {
		p, ok := last[name]
		if !ok || p.DoneBytes != size || p.TotalBytes != size {
			t.Errorf("last progress for %s: %+v (reported %v), want %d of %d", name, p, ok, size, size)
		}
	}
}

func testPublishCancelled(t *testing.T, repo repository.Repository) {
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	ctx, cancel := context.WithCancel(bg())
	cancel()
	_, err = repo.Publish(ctx, lease, NewInputs(t, SmallMemoryBytes).Request("cancelled"))
	wantErr(t, "Publish with a cancelled context", err, context.Canceled)
	if recs := mustList(t, repo, repository.Filter{}); len(recs) != 0 {
		t.Fatalf("cancelled publish is listed: %v", ids(recs))
	}
	_, err = repo.ResolveAlias(bg(), "cancelled")
	wantErr(t, "alias of cancelled publish", err, repository.ErrNotFound)
}

func testAliasConflict(t *testing.T, repo repository.Repository) {
	first, _ := Publish(t, repo, "shared")
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	in := NewInputs(t, SmallMemoryBytes)
	_, err = repo.Publish(bg(), lease, in.Request("shared"))
	wantErr(t, "second publisher of an alias", err, repository.ErrAliasConflict)
	var conflict *repository.AliasConflictError
	if !errors.As(err, &conflict) || conflict.HolderID != first.ID || conflict.Alias != "shared" {
		t.Fatalf("conflict error %v does not name holder %s", err, first.ID)
	}
	if recs := mustList(t, repo, repository.Filter{}); len(recs) != 1 || recs[0].ID != first.ID {
		t.Fatalf("after the conflict List = %v, want only %s", ids(recs), first.ID)
	}
	if id, err := repo.ResolveAlias(bg(), "shared"); err != nil || id != first.ID {
		t.Fatalf("alias moved: %s, %v", id, err)
	}
	// The loser can still publish under another alias.
	rec, err := repo.Publish(bg(), lease, in.Request("other"))
	if err != nil {
		t.Fatalf("publish after conflict: %v", err)
	}
	checkRecordMatches(t, rec, in, lease.SnapshotID(), "other")
}

func testAliasReuse(t *testing.T, repo repository.Repository) {
	first, _ := Publish(t, repo, "reuse")
	if err := repo.Delete(bg(), first.ID); err != nil {
		t.Fatal(err)
	}
	second, _ := Publish(t, repo, "reuse")
	if id, err := repo.ResolveAlias(bg(), "reuse"); err != nil || id != second.ID {
		t.Fatalf("ResolveAlias = %s, %v; want %s", id, err, second.ID)
	}
}

func testConcurrentAlias(t *testing.T, repo repository.Repository) {
	const publishers = 6
	leases := make([]repository.Lease, publishers)
	inputs := make([]Inputs, publishers)
	for i := range leases {
		l, err := repo.BeginCapture(bg())
		if err != nil {
			t.Fatal(err)
		}
		defer l.End()
		leases[i], inputs[i] = l, NewInputs(t, SmallMemoryBytes)
	}
	start := make(chan struct{})
	errs := make([]error, publishers)
	var wg sync.WaitGroup
	for i := range leases {
		wg.Go(func() {
			<-start
			_, errs[i] = repo.Publish(bg(), leases[i], inputs[i].Request("contended"))
		})
	}
	close(start)
	wg.Wait()
	winner := ""
	for i, err := range errs {
		switch {
		case err == nil && winner == "":
			winner = leases[i].SnapshotID()
		case err == nil:
			t.Fatalf("two publishers won the alias: %s and %s", winner, leases[i].SnapshotID())
		default:
			wantErr(t, "losing publisher", err, repository.ErrAliasConflict)
		}
	}
	if winner == "" {
		t.Fatal("no publisher won")
	}
	recs := mustList(t, repo, repository.Filter{})
	if len(recs) != 1 || recs[0].ID != winner {
		t.Fatalf("List = %v, want only the winner %s", ids(recs), winner)
	}
	if id, _ := repo.ResolveAlias(bg(), "contended"); id != winner {
		t.Fatalf("alias names %s, want winner %s", id, winner)
	}
}

func testDeleteIdempotent(t *testing.T, repo repository.Repository) {
	rec, _ := Publish(t, repo, "gone")
	keep, _ := Publish(t, repo, "kept")
	for i := range 2 {
		if err := repo.Delete(bg(), rec.ID); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	never, err := repository.NewID()
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Delete(bg(), never); err != nil {
		t.Fatalf("Delete of an id never published: %v", err)
	}
	_, err = repo.Get(bg(), rec.ID)
	wantErr(t, "Get after Delete", err, repository.ErrNotFound)
	_, err = repo.Resolve(bg(), rec.ID)
	wantErr(t, "Resolve after Delete", err, repository.ErrNotFound)
	_, err = repo.ResolveAlias(bg(), "gone")
	wantErr(t, "ResolveAlias after Delete", err, repository.ErrNotFound)
	_, err = repo.Lookup(bg(), "gone")
	wantErr(t, "Lookup(alias) after Delete", err, repository.ErrNotFound)
	_, err = repo.LeaseExisting(bg(), rec.ID)
	wantErr(t, "LeaseExisting after Delete", err, repository.ErrNotFound)
	if recs := mustList(t, repo, repository.Filter{}); len(recs) != 1 || recs[0].ID != keep.ID {
		t.Fatalf("List = %v, want only %s", ids(recs), keep.ID)
	}
}

// BadIDs are strings that must never be taken as snapshot ids.
func BadIDs() map[string]string {
	v7 := uuid.Must(uuid.NewV7())
	v4 := uuid.Must(uuid.NewRandom())
	return map[string]string{
		"empty":            "",
		"dot dot":          "..",
		"dot":              ".",
		"slash":            "/",
		"traversal":        "../../etc/passwd",
		"nested":           "a/b",
		"NUL":              v7.String()[:8] + "\x00",
		"uppercase v7":     strings.ToUpper(v7.String()),
		"urn form":         v7.URN(),
		"braced":           "{" + v7.String() + "}",
		"no hyphens":       strings.ReplaceAll(v7.String(), "-", ""),
		"version 4":        v4.String(),
		"nil uuid":         uuid.Nil.String(),
		"trailing slash":   v7.String() + "/",
		"trailing json":    v7.String() + ".json",
		"leading space":    " " + v7.String(),
		"plain word":       "snapshot",
		"windows traverse": `..\..\x`,
	}
}

// BadAliases are strings that must never be taken as aliases.
func BadAliases() map[string]string {
	return map[string]string{
		"empty":         "",
		"dot dot":       "..",
		"dot":           ".",
		"slash":         "a/b",
		"traversal":     "../x",
		"NUL":           "a\x00b",
		"space":         "a b",
		"too long":      strings.Repeat("a", repository.MaxAliasBytes+1),
		"non-ascii":     "caf\u00e9",
		"looks like id": uuid.Must(uuid.NewV7()).String(),
		"hex id form":   strings.ReplaceAll(uuid.Must(uuid.NewV7()).String(), "-", ""),
		"newline":       "a\nb",
		"leading dot":   ".hidden",
	}
}

func testInvalidIDs(t *testing.T, repo repository.Repository) {
	rec, _ := Publish(t, repo, "")
	for name, id := range BadIDs() {
		t.Run(name, func(t *testing.T) {
			_, err := repo.Get(bg(), id)
			wantErr(t, fmt.Sprintf("Get(%q)", id), err, repository.ErrInvalidRequest)
			err = repo.Delete(bg(), id)
			wantErr(t, fmt.Sprintf("Delete(%q)", id), err, repository.ErrInvalidRequest)
			_, err = repo.Resolve(bg(), id)
			wantErr(t, fmt.Sprintf("Resolve(%q)", id), err, repository.ErrInvalidRequest)
			_, err = repo.LeaseExisting(bg(), id)
			wantErr(t, fmt.Sprintf("LeaseExisting(%q)", id), err, repository.ErrInvalidRequest)
			if repository.RefIsID(id) {
				_, err = repo.Lookup(bg(), id)
				wantErr(t, fmt.Sprintf("Lookup(%q)", id), err, repository.ErrInvalidRequest)
			}
		})
	}
	if _, err := repo.Get(bg(), rec.ID); err != nil {
		t.Fatalf("a bad id disturbed a good snapshot: %v", err)
	}
	max := strings.Repeat("z", repository.MaxAliasBytes)
	if err := repository.ValidateAlias(max); err != nil {
		t.Fatalf("longest alias refused: %v", err)
	}
}

func testInvalidAliases(t *testing.T, repo repository.Repository) {
	in := NewInputs(t, SmallMemoryBytes)
	lease, err := repo.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	for name, alias := range BadAliases() {
		t.Run(name, func(t *testing.T) {
			if alias != "" {
				_, err := repo.Publish(bg(), lease, in.Request(alias))
				wantErr(t, fmt.Sprintf("Publish(alias %q)", alias), err, repository.ErrInvalidRequest)
			}
			_, err := repo.ResolveAlias(bg(), alias)
			wantErr(t, fmt.Sprintf("ResolveAlias(%q)", alias), err, repository.ErrInvalidRequest)
			if !repository.RefIsID(alias) { // else Lookup takes it as an id
				_, err = repo.Lookup(bg(), alias)
				wantErr(t, fmt.Sprintf("Lookup(%q)", alias), err, repository.ErrInvalidRequest)
			}
		})
	}
	// A leading '-' reads as a flag on a command line: no new binding
	// takes it, while a lookup of one (an older build may have bound it)
	// is still a lookup.
	_, err = repo.Publish(bg(), lease, in.Request("-x"))
	wantErr(t, `Publish(alias "-x")`, err, repository.ErrInvalidRequest)
	_, err = repo.ResolveAlias(bg(), "-x")
	wantErr(t, `ResolveAlias("-x")`, err, repository.ErrNotFound)
	if recs := mustList(t, repo, repository.Filter{}); len(recs) != 0 {
		t.Fatalf("bad aliases published: %v", ids(recs))
	}
	longest := strings.Repeat("A", repository.MaxAliasBytes-2) + "_-"
	if _, err := repo.Publish(bg(), lease, in.Request(longest)); err != nil {
		t.Fatalf("longest valid alias: %v", err)
	}
}

func testListFilter(t *testing.T, repo repository.Repository) {
	web1, web1Lease := Publish(t, repo, "web-1")
	web2, _ := Publish(t, repo, "web-2")
	db1, _ := Publish(t, repo, "db-1")
	none, _ := Publish(t, repo, "")
	if _, err := repo.AttachManifest(bg(), web1Lease, ManifestBytes(t, 100), nil); err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	cases := []struct {
		name string
		f    repository.Filter
		want []string
	}{
		{"all", repository.Filter{}, []string{web1.ID, web2.ID, db1.ID, none.ID}},
		{"prefix", repository.Filter{AliasPrefix: "web-"}, []string{web1.ID, web2.ID}},
		{"whole alias as prefix", repository.Filter{AliasPrefix: "db-1"}, []string{db1.ID}},
		{"prefix matching nothing", repository.Filter{AliasPrefix: "x"}, nil},
		{"with manifest", repository.Filter{HasManifest: &yes}, []string{web1.ID}},
		{"without manifest", repository.Filter{HasManifest: &no}, []string{web2.ID, db1.ID, none.ID}},
		{"prefix and without manifest", repository.Filter{AliasPrefix: "web", HasManifest: &no}, []string{web2.ID}},
	}
	for _, tc := range cases {
		got := ids(mustList(t, repo, tc.f))
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s: List = %v, want %v (in creation order)", tc.name, got, tc.want)
		}
	}
	_, err := repo.List(bg(), repository.Filter{AliasPrefix: "a/b"})
	wantErr(t, "List with a bad prefix", err, repository.ErrInvalidRequest)
}

func testAttach(t *testing.T, repo repository.Repository) {
	rec, lease := Publish(t, repo, "m")
	data := ManifestBytes(t, 12345)
	desc, err := repo.AttachManifest(bg(), lease, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if desc.SHA256 != SHA256Hex(data) || desc.Size != int64(len(data)) {
		t.Fatalf("descriptor %+v, want sha %s size %d", desc, SHA256Hex(data), len(data))
	}
	checkAttached(t, repo, rec.ID, data)
	checkReattached(t, repo, rec, lease, data)
}

// checkReattached: attaching again to rec (under lease, data attached)
// replaces the manifest, the recording comes and goes with the manifest
// it describes, and the rest of the record stays.
func checkReattached(t *testing.T, repo repository.Repository, rec repository.Record, lease repository.Lease, data []byte) {
	t.Helper()
	overlap, rho := 0.75, -0.25
	recording := &repository.Recording{Runs: 2, Overlap: &overlap, RankCorrelation: &rho}
	data2 := ManifestBytes(t, 777)
	if _, err := repo.AttachManifest(bg(), lease, data2, recording); err != nil {
		t.Fatal(err)
	}
	checkAttached(t, repo, rec.ID, data2)
	if got := mustGet(t, repo, rec.ID).ManifestRecording; got == nil || got.Runs != 2 || *got.Overlap != overlap || *got.RankCorrelation != rho {
		t.Fatalf("recording in the record %+v, attached %+v", got, recording)
	}
	bad := &repository.Recording{Runs: 3}
	_, err := repo.AttachManifest(bg(), lease, ManifestBytes(t, 5), bad)
	wantErr(t, "attach with a recording of three runs", err, repository.ErrInvalidRequest)
	checkAttached(t, repo, rec.ID, data2)
	if _, err := repo.AttachManifest(bg(), lease, data, nil); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, repo, rec.ID).ManifestRecording; got != nil {
		t.Fatalf("a manifest attached without a recording kept the old one: %+v", got)
	}
	// The rest of the record is untouched.
	got, err := repo.Get(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	got.Manifest = nil
	if got.MemorySHA256 != rec.MemorySHA256 || got.Alias != rec.Alias || !got.CreatedAt.Equal(rec.CreatedAt) || !got.Layout.Equal(rec.Layout) {
		t.Fatalf("attach changed the record: %+v, was %+v", got, rec)
	}
}

// checkAttached asserts that id's record carries the descriptor of data and
// that the manifest Resolve points at holds data.
func checkAttached(t *testing.T, repo repository.Repository, id string, data []byte) {
	t.Helper()
	res, err := repo.Resolve(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	m := res.Record.Manifest
	if m == nil || m.SHA256 != SHA256Hex(data) || m.Size != int64(len(data)) {
		t.Fatalf("record manifest %+v, want sha %s size %d", m, SHA256Hex(data), len(data))
	}
	if res.ManifestPath == "" {
		t.Fatal("no manifest path")
	}
	if FileSHA256(t, res.ManifestPath) != m.SHA256 {
		t.Fatal("manifest file does not match its descriptor")
	}
}

func testAttachRefused(t *testing.T, repo repository.Repository) {
	t.Run("bad sizes", func(t *testing.T) {
		_, lease := Publish(t, repo, "")
		_, err := repo.AttachManifest(bg(), lease, nil, nil)
		wantErr(t, "empty manifest", err, repository.ErrInvalidRequest)
		_, err = repo.AttachManifest(bg(), lease, make([]byte, repository.MaxManifestBytes+1), nil)
		wantErr(t, "oversize manifest", err, repository.ErrInvalidRequest)
	})
	t.Run("lease ended", func(t *testing.T) {
		rec, lease := Publish(t, repo, "")
		if err := lease.End(); err != nil {
			t.Fatal(err)
		}
		_, err := repo.AttachManifest(bg(), lease, ManifestBytes(t, 10), nil)
		wantErr(t, "attach after End", err, repository.ErrLeaseEnded)
		got, err := repo.Get(bg(), rec.ID)
		if err != nil || got.Manifest != nil {
			t.Fatalf("refused attach changed the record: %+v, %v", got.Manifest, err)
		}
	})
	t.Run("deleted", func(t *testing.T) {
		rec, lease := Publish(t, repo, "deleted")
		if err := repo.Delete(bg(), rec.ID); err != nil {
			t.Fatal(err)
		}
		_, err := repo.AttachManifest(bg(), lease, ManifestBytes(t, 10), nil)
		wantErr(t, "attach after Delete", err, repository.ErrNotFound)
		_, err = repo.Get(bg(), rec.ID)
		wantErr(t, "Get after refused attach", err, repository.ErrNotFound)
		if recs := mustList(t, repo, repository.Filter{AliasPrefix: "deleted"}); len(recs) != 0 {
			t.Fatalf("refused attach resurrected %v", ids(recs))
		}
	})
	t.Run("not yet published", func(t *testing.T) {
		lease, err := repo.BeginCapture(bg())
		if err != nil {
			t.Fatal(err)
		}
		defer lease.End()
		_, err = repo.AttachManifest(bg(), lease, ManifestBytes(t, 10), nil)
		wantErr(t, "attach before Publish", err, repository.ErrNotFound)
		_, err = repo.Get(bg(), lease.SnapshotID())
		wantErr(t, "Get after attach before Publish", err, repository.ErrNotFound)
	})
}

func testLeaseExisting(t *testing.T, repo repository.Repository) {
	rec, capture := Publish(t, repo, "")
	if err := capture.End(); err != nil {
		t.Fatal(err)
	}
	a, err := repo.LeaseExisting(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer a.End()
	b, err := repo.LeaseExisting(bg(), rec.ID)
	if err != nil {
		t.Fatalf("second lease on one snapshot: %v", err)
	}
	defer b.End()
	if a.SnapshotID() != rec.ID {
		t.Fatalf("lease on %s, want %s", a.SnapshotID(), rec.ID)
	}
	data := ManifestBytes(t, 99)
	if _, err := repo.AttachManifest(bg(), a, data, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.End(); err != nil {
		t.Fatal(err)
	}
	data2 := ManifestBytes(t, 98)
	if _, err := repo.AttachManifest(bg(), b, data2, nil); err != nil {
		t.Fatalf("attach under the other lease after the first ended: %v", err)
	}
	checkAttached(t, repo, rec.ID, data2)
	never, _ := repository.NewID()
	_, err = repo.LeaseExisting(bg(), never)
	wantErr(t, "LeaseExisting of an unknown id", err, repository.ErrNotFound)
}

// testEndWaitsForAttach checks that once End returns, no attach under the
// lease changes the record any more.
func testEndWaitsForAttach(t *testing.T, repo repository.Repository) {
	rec, lease := Publish(t, repo, "")
	attached := make(chan struct{})
	finished := make(chan error)
	go func() {
		first := true
		for i := 0; ; i++ {
			// Every attach writes different bytes, so any attach landing
			// after End would show.
			_, err := repo.AttachManifest(bg(), lease, []byte(fmt.Sprintf("manifest %d", i)), nil)
			if err != nil {
				finished <- err
				return
			}
			if first {
				close(attached)
				first = false
			}
		}
	}()
	<-attached
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	atEnd, err := repo.Get(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, "attach loop", <-finished, repository.ErrLeaseEnded)
	after, err := repo.Get(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if *after.Manifest != *atEnd.Manifest {
		t.Fatalf("record changed after End returned: %+v then %+v", atEnd.Manifest, after.Manifest)
	}
	checkAttached(t, repo, rec.ID, attachedBytes(t, repo, rec.ID))
}

// attachedBytes returns the bytes of id's attached manifest.
func attachedBytes(t *testing.T, repo repository.Repository, id string) []byte {
	t.Helper()
	res, err := repo.Resolve(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(res.ManifestPath)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// testAttachRacingDelete races one attach against one delete of the same
// snapshot, many times. Whatever the order, a deleted snapshot stays deleted,
// and an attach that succeeded left a record whose descriptor matches its
// file for as long as the record lived.
func testAttachRacingDelete(t *testing.T, repo repository.Repository) {
	var attachWon, deleteWon int
	for i := range AttachDeleteRaceIterations {
		rec, lease := Publish(t, repo, fmt.Sprintf("race-%d", i))
		data := ManifestBytes(t, 256+i)
		start := make(chan struct{})
		var attachErr, deleteErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			<-start
			var desc repository.ManifestDescriptor
			desc, attachErr = repo.AttachManifest(bg(), lease, data, nil)
			if attachErr != nil {
				return
			}
			if desc.SHA256 != SHA256Hex(data) {
				attachErr = fmt.Errorf("descriptor %s does not match the data", desc.SHA256)
				return
			}
			// The delete may run at any moment now, but while the
			// record is visible it must carry this descriptor.
			got, err := repo.Get(bg(), rec.ID)
			if errors.Is(err, repository.ErrNotFound) {
				return
			}
			if err != nil || got.Manifest == nil || got.Manifest.SHA256 != desc.SHA256 {
				attachErr = fmt.Errorf("after a successful attach the record has %+v (%v)", got.Manifest, err)
			}
		})
		wg.Go(func() {
			<-start
			deleteErr = repo.Delete(bg(), rec.ID)
		})
		close(start)
		wg.Wait()
		if deleteErr != nil {
			t.Fatalf("iteration %d: Delete: %v", i, deleteErr)
		}
		switch {
		case attachErr == nil:
			attachWon++
		case errors.Is(attachErr, repository.ErrNotFound):
			deleteWon++
		default:
			t.Fatalf("iteration %d: AttachManifest: %v", i, attachErr)
		}
		if _, err := repo.Get(bg(), rec.ID); !errors.Is(err, repository.ErrNotFound) {
			t.Fatalf("iteration %d: snapshot resurrected: Get = %v", i, err)
		}
		if _, err := repo.Resolve(bg(), rec.ID); !errors.Is(err, repository.ErrNotFound) {
			t.Fatalf("iteration %d: snapshot resurrected: Resolve = %v", i, err)
		}
		if _, err := repo.ResolveAlias(bg(), rec.Alias); !errors.Is(err, repository.ErrNotFound) {
			t.Fatalf("iteration %d: alias resurrected: %v", i, err)
		}
	}
	if recs := mustList(t, repo, repository.Filter{}); len(recs) != 0 {
		t.Fatalf("records left after every delete: %v", ids(recs))
	}
	t.Logf("attach before delete %d times, delete before attach %d times", attachWon, deleteWon)
}

// mustGet returns id's record.
func mustGet(t *testing.T, repo repository.Repository, id string) repository.Record {
	t.Helper()
	rec, err := repo.Get(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}
