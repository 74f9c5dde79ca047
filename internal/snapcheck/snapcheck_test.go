package snapcheck

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"warmstart/internal/integrity"
	"warmstart/internal/manifest"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/posixfs/posixfstest"
	"warmstart/internal/repository/repotest"
)

func bg() context.Context { return context.Background() }

// fixture is a posixfs store holding one published snapshot.
type fixture struct {
	repo  *posixfs.Repo
	in    repotest.Inputs
	rec   repository.Record
	files repository.Resolved
}

// memoryBytes spans several read buffers and ends inside one.
const memoryBytes = 3*CopyBufferBytes + 5*integrity.BlockBytes

func newFixture(t *testing.T) *fixture {
	t.Helper()
	repo, err := posixfs.Open(filepath.Join(t.TempDir(), "store"), posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{repo: repo}
	f.rec, f.in = publish(t, repo, "web")
	if f.files, err = repo.Resolve(bg(), f.rec.ID); err != nil {
		t.Fatal(err)
	}
	return f
}

// publish publishes a snapshot of memoryBytes with a startup manifest.
func publish(t *testing.T, repo repository.Repository, alias string) (repository.Record, repotest.Inputs) {
	t.Helper()
	in := repotest.NewInputs(t, memoryBytes)
	rec, lease := repotest.PublishInputs(t, repo, in, alias)
	m, err := manifest.Build(rec.Layout, []int64{0, 8192, 2 * CopyBufferBytes})
	if err != nil {
		t.Fatal(err)
	}
	data, err := manifest.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := repo.AttachManifest(bg(), lease, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec.Manifest = &desc
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	return rec, in
}

// writable makes a stored artifact (0444) writable for the duration of fn,
// as a stray process or a disk would change it.
func writable(t *testing.T, path string, fn func()) {
	t.Helper()
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	fn()
	if err := os.Chmod(path, 0o444); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
}

func verify(t *testing.T, repo repository.Repository, ref string, opts Options) Report {
	t.Helper()
	r, err := Verify(bg(), repo, ref, opts)
	if err != nil {
		t.Fatalf("Verify(%s): %v", ref, err)
	}
	return r
}

// problemKinds lists the kinds of an artifact's problems.
func problemKinds(a *Artifact) []string {
	var kinds []string
	for _, p := range a.Problems {
		kinds = append(kinds, p.Kind)
	}
	return kinds
}

func wantArtifact(t *testing.T, r Report, name, status string, kinds ...string) *Artifact {
	t.Helper()
	a := r.artifact(name)
	if a.Status != status || strings.Join(problemKinds(a), ",") != strings.Join(kinds, ",") {
		t.Fatalf("%s: status %s, problems %+v; want %s with %v", name, a.Status, a.Problems, status, kinds)
	}
	return a
}

func TestCleanSnapshotIsOK(t *testing.T) {
	f := newFixture(t)
	var last repository.ImportProgress
	calls := 0
	r := verify(t, f.repo, "web", Options{Progress: func(p Progress) {
		if p.SnapshotID != f.rec.ID || p.Step != repository.StepVerify {
			t.Errorf("progress %+v", p)
		}
		if p.Artifact == repository.MemoryFileName {
			last = p.ImportProgress
			calls++
		}
	}})
	if !r.OK || r.Unverified || len(r.Problems) != 0 || r.ID != f.rec.ID || r.Alias != "web" {
		t.Fatalf("clean snapshot: %+v", r)
	}
	for _, name := range []string{repository.VMStateFileName, repository.DigestsFileName, repository.ManifestFileName} {
		wantArtifact(t, r, name, StatusOK)
	}
	mem := wantArtifact(t, r, repository.MemoryFileName, StatusOK)
	if mem.ReadBytes != memoryBytes || mem.ReadSHA256 != f.rec.MemorySHA256 {
		t.Errorf("memory read %d bytes hashing to %s", mem.ReadBytes, mem.ReadSHA256)
	}
	wantBlocks := int64(memoryBytes+integrity.BlockBytes-1) / integrity.BlockBytes
	if b := mem.Blocks; b == nil || b.Checked != wantBlocks || b.Bad != 0 || len(b.BadRanges) != 0 {
		t.Errorf("blocks %+v, want %d checked and none bad", mem.Blocks, wantBlocks)
	}
	if last.DoneBytes != memoryBytes || last.TotalBytes != memoryBytes || calls != 4 {
		t.Errorf("memory progress: %d calls, last %+v; want one per 1 MiB read, ending at %d", calls, last, memoryBytes)
	}
}

// TestFlippedBytesReportedAtTheirBlocks damages single blocks and a run of
// two: each is reported at its offset, the run as one range.
func TestFlippedBytesReportedAtTheirBlocks(t *testing.T) {
	f := newFixture(t)
	const bs = integrity.BlockBytes
	lastBlock := int64(memoryBytes - bs)
	repotest.FlipBytes(t, f.files.MemoryPath, 3*bs+17, 10*bs, 11*bs+bs-1, lastBlock+99)
	r := verify(t, f.repo, f.rec.ID, Options{})
	if r.OK {
		t.Fatal("damaged memory reported OK")
	}
	mem := wantArtifact(t, r, repository.MemoryFileName, StatusBad, KindSHA256, KindBadBlocks)
	want := []Range{{Offset: 3 * bs, Length: bs, Blocks: 1}, {Offset: 10 * bs, Length: 2 * bs, Blocks: 2}, {Offset: lastBlock, Length: bs, Blocks: 1}}
	if mem.Blocks == nil || mem.Blocks.Bad != 4 || !equalRanges(mem.Blocks.BadRanges, want) {
		t.Fatalf("bad blocks %+v, want 4 in %+v", mem.Blocks, want)
	}
	wantArtifact(t, r, repository.VMStateFileName, StatusOK)
	wantArtifact(t, r, repository.DigestsFileName, StatusOK)

	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"PROBLEMS FOUND", "offset 12288 (0x3000), 4096 bytes (1 block)",
		"offset 40960 (0xa000), 8192 bytes (2 blocks)", fmt.Sprintf("4 of %d blocks do not match", mem.Blocks.Checked)} {
		if !strings.Contains(text.String(), line) {
			t.Errorf("text report lacks %q:\n%s", line, text.String())
		}
	}
}

// TestCoalesce merges consecutive blocks and ends a range that holds a
// short last block at the end of the file.
func TestCoalesce(t *testing.T) {
	const bs = integrity.BlockBytes
	got := coalesce([]int64{0, bs, 5 * bs, 7 * bs, 8 * bs}, 8*bs+100)
	want := []Range{{0, 2 * bs, 2}, {5 * bs, bs, 1}, {7 * bs, bs + 100, 2}}
	if !equalRanges(got, want) {
		t.Fatalf("coalesce = %+v, want %+v", got, want)
	}
	if got := coalesce(nil, bs); got == nil || len(got) != 0 {
		t.Fatalf("coalesce of no blocks = %#v, want an empty list (JSON [])", got)
	}
}

func equalRanges(a, b []Range) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSwappedMemoryFileReportsEveryBlock replaces memory.bin with another
// file of its size: every block differs, and so does the SHA-256.
func TestSwappedMemoryFileReportsEveryBlock(t *testing.T) {
	f := newFixture(t)
	other := make([]byte, memoryBytes)
	if _, err := rand.Read(other); err != nil {
		t.Fatal(err)
	}
	writable(t, f.files.MemoryPath, func() {
		if err := os.WriteFile(f.files.MemoryPath, other, 0o444); err != nil {
			t.Fatal(err)
		}
	})
	r := verify(t, f.repo, f.rec.ID, Options{})
	mem := wantArtifact(t, r, repository.MemoryFileName, StatusBad, KindSHA256, KindBadBlocks)
	b := mem.Blocks
	if b == nil || b.Bad != b.Checked || len(b.BadRanges) != 1 || b.BadRanges[0] != (Range{Offset: 0, Length: memoryBytes, Blocks: b.Checked}) {
		t.Fatalf("blocks %+v; want all %d bad, in one range over the file", b, b.Checked)
	}
}

// TestDamagedArtifactsAreProblems damages each artifact in the ways a disk
// or a person can: every one is a problem named in the report, none stops
// the verification or panics.
func TestDamagedArtifactsAreProblems(t *testing.T) {
	for _, tc := range []struct {
		name     string
		damage   func(t *testing.T, f *fixture)
		artifact string
		kind     string
	}{
		{"memory truncated", func(t *testing.T, f *fixture) { truncate(t, f.files.MemoryPath, memoryBytes-1) }, repository.MemoryFileName, KindUnresolved},
		{"memory removed", func(t *testing.T, f *fixture) { remove(t, f.files.MemoryPath) }, repository.MemoryFileName, KindUnresolved},
		{"vm state removed", func(t *testing.T, f *fixture) { remove(t, f.files.VMStatePath) }, repository.VMStateFileName, KindUnresolved},
		{"vm state flipped", func(t *testing.T, f *fixture) { repotest.FlipBytes(t, f.files.VMStatePath, 7) }, repository.VMStateFileName, KindSHA256},
		{"vm state is a FIFO", func(t *testing.T, f *fixture) { fifo(t, f.files.VMStatePath) }, repository.VMStateFileName, KindUnresolved},
		{"digests removed", func(t *testing.T, f *fixture) { remove(t, f.files.DigestsPath) }, repository.DigestsFileName, KindMissing},
		{"digests truncated", func(t *testing.T, f *fixture) { truncate(t, f.files.DigestsPath, 30) }, repository.DigestsFileName, KindSize},
		{"digests flipped", func(t *testing.T, f *fixture) { repotest.FlipBytes(t, f.files.DigestsPath, 40) }, repository.DigestsFileName, KindSHA256},
		{"digests is a FIFO", func(t *testing.T, f *fixture) { fifo(t, f.files.DigestsPath) }, repository.DigestsFileName, KindNotRegular},
		{"digests is a symlink", func(t *testing.T, f *fixture) { symlink(t, f.files.DigestsPath) }, repository.DigestsFileName, KindNotRegular},
		{"manifest removed", func(t *testing.T, f *fixture) { remove(t, f.files.ManifestPath) }, repository.ManifestFileName, KindMissing},
		{"manifest flipped", func(t *testing.T, f *fixture) { repotest.FlipBytes(t, f.files.ManifestPath, 3) }, repository.ManifestFileName, KindSHA256},
		{"manifest truncated", func(t *testing.T, f *fixture) { truncate(t, f.files.ManifestPath, 10) }, repository.ManifestFileName, KindSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.damage(t, f)
			r := verify(t, f.repo, f.rec.ID, Options{})
			a := r.artifact(tc.artifact)
			if r.OK || a.Status != StatusBad || len(a.Problems) == 0 || a.Problems[0].Kind != tc.kind {
				t.Fatalf("report ok=%t, %s: %+v; want a %s problem", r.OK, tc.artifact, *a, tc.kind)
			}
			var text bytes.Buffer
			if err := WriteText(&text, r); err != nil || !strings.Contains(text.String(), tc.kind+": ") {
				t.Fatalf("text report (%v) does not name the %s problem:\n%s", err, tc.kind, text.String())
			}
		})
	}
}

func truncate(t *testing.T, path string, size int64) {
	t.Helper()
	writable(t, path, func() {
		if err := os.Truncate(path, size); err != nil {
			t.Fatal(err)
		}
	})
}

func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

func fifo(t *testing.T, path string) {
	t.Helper()
	remove(t, path)
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

// symlink replaces path with a symlink to a copy of its bytes.
func symlink(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(target, data, 0o444); err != nil {
		t.Fatal(err)
	}
	remove(t, path)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// TestLegacySnapshotGetsDigests: a snapshot without a table is OK but
// unverified; AddDigests attaches the table publish would have computed,
// and a later verification checks every block against it.
func TestLegacySnapshotGetsDigests(t *testing.T) {
	f := newFixture(t)
	posixfstest.StripDigests(t, f.repo.Root(), f.rec.ID)
	r := verify(t, f.repo, "web", Options{})
	if !r.OK || !r.Unverified || r.DigestsAdded != nil {
		t.Fatalf("legacy snapshot: %+v", r)
	}
	if a := wantArtifact(t, r, repository.DigestsFileName, StatusAbsent); !strings.Contains(a.Note, "unverified (no digest table)") {
		t.Errorf("note %q", a.Note)
	}
	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil || !strings.Contains(text.String(), "ok, unverified (no digest table)") {
		t.Fatalf("text report (%v):\n%s", err, text.String())
	}

	r = verify(t, f.repo, "web", Options{AddDigests: true})
	if !r.OK || r.Unverified || r.DigestsAdded == nil || *r.DigestsAdded != *f.rec.MemoryDigests ||
		r.SHA256DigestsAdded == nil || *r.SHA256DigestsAdded != *f.rec.MemorySHA256Digests {
		t.Fatalf("add digests: %+v; want the tables publish computed, %+v and %+v", r, *f.rec.MemoryDigests, *f.rec.MemorySHA256Digests)
	}
	wantArtifact(t, r, repository.DigestsFileName, StatusAdded)
	repotest.CheckDigests(t, f.repo, f.rec.ID, repotest.DigestTable(t, f.in.MemoryPath))

	r = verify(t, f.repo, "web", Options{})
	mem := wantArtifact(t, r, repository.MemoryFileName, StatusOK)
	if !r.OK || r.Unverified || mem.Blocks == nil || mem.Blocks.Bad != 0 {
		t.Fatalf("after adding digests: %+v", r)
	}
	// Adding again to a snapshot that has a table changes nothing.
	if r = verify(t, f.repo, "web", Options{AddDigests: true}); !r.OK || r.DigestsAdded != nil {
		t.Fatalf("add digests to a snapshot with a table: %+v", r)
	}
}

// TestRecordWithoutItsTableIsAProblem: a format-2 record without its
// digest table was changed after publish (restores refuse it); verify
// says so instead of calling it an unverified legacy snapshot.
func TestRecordWithoutItsTableIsAProblem(t *testing.T) {
	f := newFixture(t)
	posixfstest.EditRecord(t, f.repo.Root(), f.rec.ID, func(fields map[string]any) { delete(fields, "memory_digests") })
	r := verify(t, f.repo, "web", Options{})
	a := wantArtifact(t, r, repository.DigestsFileName, StatusBad, KindMissing)
	if r.OK || r.Unverified || !strings.Contains(a.Problems[0].Message, "changed after publish") {
		t.Fatalf("format-2 record without a table: %+v", r)
	}
}

// TestMissingSHA256TableIsAdded: a snapshot published before tables of
// SHA-256 digests is checked against its CRC-32C table, says what it
// lacks, and AddDigests gives it the SHA-256 table a publish writes now.
func TestMissingSHA256TableIsAdded(t *testing.T) {
	f := newFixture(t)
	posixfstest.StripSHA256Digests(t, f.repo.Root(), f.rec.ID)
	r := verify(t, f.repo, "web", Options{})
	mem := wantArtifact(t, r, repository.MemoryFileName, StatusOK)
	d := wantArtifact(t, r, repository.SHA256DigestsFileName, StatusAbsent)
	if !r.OK || r.Unverified || mem.Blocks == nil || mem.Blocks.Bad != 0 || !strings.Contains(d.Note, "no table of SHA-256 digests") {
		t.Fatalf("snapshot without a SHA-256 table: %+v", r)
	}
	r = verify(t, f.repo, "web", Options{AddDigests: true})
	if !r.OK || r.DigestsAdded != nil || r.SHA256DigestsAdded == nil || *r.SHA256DigestsAdded != *f.rec.MemorySHA256Digests {
		t.Fatalf("add digests: %+v; want the SHA-256 table publish computed, %+v", r, *f.rec.MemorySHA256Digests)
	}
	rec, err := f.repo.Get(bg(), f.rec.ID)
	if err != nil || rec.MemorySHA256Digests == nil || *rec.MemorySHA256Digests != *f.rec.MemorySHA256Digests {
		t.Fatalf("record after adding: %+v, %v", rec.MemorySHA256Digests, err)
	}
	if r = verify(t, f.repo, "web", Options{AddDigests: true}); !r.OK || r.SHA256DigestsAdded != nil {
		t.Fatalf("add digests to a snapshot with both tables: %+v", r)
	}
}

// TestAddDigestsRefusedForChangedMemory: once memory.bin no longer matches
// the record's SHA-256, no table is attached for it.
func TestAddDigestsRefusedForChangedMemory(t *testing.T) {
	f := newFixture(t)
	posixfstest.StripDigests(t, f.repo.Root(), f.rec.ID)
	repotest.FlipBytes(t, f.files.MemoryPath, 5000)
	r := verify(t, f.repo, f.rec.ID, Options{AddDigests: true})
	if r.OK || r.DigestsAdded != nil || !r.Unverified {
		t.Fatalf("add digests over changed memory: %+v", r)
	}
	wantArtifact(t, r, repository.MemoryFileName, StatusBad, KindSHA256)
	a := wantArtifact(t, r, repository.DigestsFileName, StatusBad, KindNotAdded)
	if !strings.Contains(a.Problems[0].Message, "does not match the record's SHA-256") {
		t.Errorf("refusal says %q", a.Problems[0].Message)
	}
	rec, err := f.repo.Get(bg(), f.rec.ID)
	if err != nil || rec.MemoryDigests != nil {
		t.Fatalf("refused add left the record with %+v (%v)", rec.MemoryDigests, err)
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(f.files.MemoryPath), repository.DigestsFileName)); !os.IsNotExist(err) {
		t.Fatalf("refused add wrote a table: %v", err)
	}
}

func TestVerifyAllCoversEverySnapshot(t *testing.T) {
	f := newFixture(t)
	second, _ := publish(t, f.repo, "")
	third, _ := publish(t, f.repo, "db")
	res, err := f.repo.Resolve(bg(), second.ID)
	if err != nil {
		t.Fatal(err)
	}
	repotest.FlipBytes(t, res.MemoryPath, 0)
	reports, err := VerifyAll(bg(), f.repo, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range reports {
		got = append(got, r.ID)
		if r.OK != (r.ID != second.ID) {
			t.Errorf("%s: ok=%t", r.ID, r.OK)
		}
	}
	if want := []string{f.rec.ID, second.ID, third.ID}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("VerifyAll covered %v, want %v", got, want)
	}
}

func TestRefsThatNameNoSnapshot(t *testing.T) {
	f := newFixture(t)
	if _, err := Verify(bg(), f.repo, "nobody", Options{}); !errors.Is(err, repository.ErrNotFound) {
		t.Errorf("unknown alias: %v", err)
	}
	if _, err := Verify(bg(), f.repo, "a/b", Options{}); !errors.Is(err, repository.ErrInvalidRequest) {
		t.Errorf("malformed alias: %v", err)
	}
	ctx, cancel := context.WithCancel(bg())
	cancel()
	if _, err := Verify(ctx, f.repo, "web", Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

// TestUndecodableRecordIsAProblem: a record that cannot be read is
// reported, not an error that hides it.
func TestUndecodableRecordIsAProblem(t *testing.T) {
	f := newFixture(t)
	path := filepath.Join(f.repo.Root(), "catalog", "records", f.rec.ID+".json")
	if err := os.WriteFile(path, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := verify(t, f.repo, f.rec.ID, Options{})
	if r.OK || r.ID != f.rec.ID || len(r.Problems) != 1 || r.Problems[0].Kind != KindRecord {
		t.Fatalf("undecodable record: %+v", r)
	}
}

// TestVerifyAllReportsDamagedEntries: verify --all covers the catalog
// entries that do not decode (a record, an alias binding), each as a
// report with a problem; List leaves them out, and a store whose only
// record is damaged verified as "no snapshots", all well.
func TestVerifyAllReportsDamagedEntries(t *testing.T) {
	f := newFixture(t)
	second, _ := publish(t, f.repo, "db")
	catalog := filepath.Join(f.repo.Root(), "catalog")
	if err := os.WriteFile(filepath.Join(catalog, "records", second.ID+".json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(catalog, "aliases", "web"), []byte("not an id\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	reports, err := VerifyAll(bg(), f.repo, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for _, r := range reports {
		if !r.OK {
			if len(r.Problems) == 0 || r.Problems[0].Kind != KindRecord {
				t.Errorf("damaged entry %s%s reported without a record problem: %+v", r.ID, r.Alias, r)
			}
			bad = append(bad, r.ID+r.Alias)
		}
	}
	if want := []string{second.ID, "web"}; strings.Join(bad, ",") != strings.Join(want, ",") {
		t.Fatalf("VerifyAll found %v damaged, want %v (reports %+v)", bad, want, reports)
	}
}

// TestSnapshotDeletedDuringVerify: a snapshot deleted while its memory is
// read is not reported OK: the bytes read were those of unlinked files,
// and a caller that goes on to use the snapshot would find nothing.
// VerifyAll leaves it out, as it does one deleted before its turn.
func TestSnapshotDeletedDuringVerify(t *testing.T) {
	for _, all := range []bool{false, true} {
		t.Run(fmt.Sprintf("all=%t", all), func(t *testing.T) {
			f := newFixture(t)
			var once sync.Once
			opts := Options{Progress: func(p Progress) {
				if p.Artifact == repository.MemoryFileName {
					once.Do(func() {
						if err := f.repo.Delete(bg(), f.rec.ID); err != nil {
							t.Errorf("delete during verify: %v", err)
						}
					})
				}
			}}
			if all {
				reports, err := VerifyAll(bg(), f.repo, opts)
				if err != nil || len(reports) != 0 {
					t.Fatalf("VerifyAll: %d reports (%+v), %v; want none", len(reports), reports, err)
				}
				return
			}
			r, err := Verify(bg(), f.repo, "web", opts)
			if !errors.Is(err, repository.ErrNotFound) || !strings.Contains(fmt.Sprint(err), "deleted while") {
				t.Fatalf("Verify: report ok=%t, %v; want ErrNotFound saying it was deleted while verified", r.OK, err)
			}
		})
	}
}
