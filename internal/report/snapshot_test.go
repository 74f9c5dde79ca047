package report

import (
	"strings"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/repository"
)

// TestDeleteLines: both delete paths (in process and on a daemon) print
// these, so their wording is fixed here once.
func TestDeleteLines(t *testing.T) {
	const id = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	for _, tc := range []struct {
		name string
		run  func(*strings.Builder) error
		want string
	}{
		{"absent id", func(b *strings.Builder) error { return NothingToDelete(b, id) }, "snapshot " + id + " does not exist; nothing to delete\n"},
		{"absent alias", func(b *strings.Builder) error { return NothingToDelete(b, "web") }, "no snapshot has alias web; nothing to delete\n"},
		{"deleted", func(b *strings.Builder) error { return Deleted(b, id, "") }, "deleted snapshot " + id + "\n"},
		{"deleted alias", func(b *strings.Builder) error { return Deleted(b, id, "web") }, "deleted snapshot " + id + " (alias web)\n"},
		{"released dangling alias", func(b *strings.Builder) error {
			return Deletion(b, "web", repository.Deletion{ID: id, Alias: "web", Released: true})
		}, "alias web named snapshot " + id + ", which no longer exists; released the alias\n"},
		{"deletion", func(b *strings.Builder) error {
			return Deletion(b, "web", repository.Deletion{ID: id, Alias: "web"})
		}, "deleted snapshot " + id + " (alias web)\n"},
		{"absent deletion", func(b *strings.Builder) error {
			return Deletion(b, "web", repository.Deletion{Alias: "web", Absent: true})
		},
			"no snapshot has alias web; nothing to delete\n"},
	} {
		var b strings.Builder
		if err := tc.run(&b); err != nil || b.String() != tc.want {
			t.Errorf("%s: printed %q (error %v), want %q", tc.name, b.String(), err, tc.want)
		}
	}
	if got := Size(3000); got != "2.9 KiB" {
		t.Errorf("Size(3000) = %q", got)
	}
}

// TestSnapshotTextShowsTheRefinement: snapshot show says what was learned.
func TestSnapshotTextShowsTheRefinement(t *testing.T) {
	rec := repository.Record{ID: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
		Manifest:   &repository.ManifestDescriptor{SHA256: "aa", Size: 100},
		Refinement: &repository.RefinementDescriptor{ManifestSHA256: "bb", Pages: 1404, Restores: 3}}
	var b strings.Builder
	if err := Snapshot(&b, api.SnapshotInfo{Record: rec, Files: &api.SnapshotFiles{}}, false); err != nil {
		t.Fatal(err)
	}
	if want := "refined manifest:  sha256 bb, 1404 pages, learned from 3 restores"; !strings.Contains(b.String(), want) {
		t.Fatalf("snapshot show:\n%s\nlacks %q", b.String(), want)
	}
}

// TestRecordingLine: how a manifest was recorded reads the same in
// `snapshot show` and after a recording.
func TestRecordingLine(t *testing.T) {
	overlap, rho := 0.8125, -0.5
	for _, tc := range []struct {
		name     string
		rec      repository.Recording
		fallback string
		want     string
	}{
		{"one run", repository.Recording{Runs: 1}, "", "pages of 1 recording run"},
		{"two runs", repository.Recording{Runs: 2, Overlap: &overlap, RankCorrelation: &rho}, "",
			"pages both of 2 recording runs touched; runs overlap 0.812, rank correlation -0.500"},
		{"disjoint runs", repository.Recording{Runs: 1, Overlap: new(float64)}, "the two runs touched no page in common",
			"pages of 1 recording run; runs overlap 0.000 (the two runs touched no page in common)"},
	} {
		if got := RecordingLine(tc.rec, tc.fallback); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	id := "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	rec := repository.Record{ID: id, Manifest: &repository.ManifestDescriptor{SHA256: "ab", Size: 10},
		ManifestRecording: &repository.Recording{Runs: 2, Overlap: &overlap, RankCorrelation: &rho}}
	var b strings.Builder
	if err := Snapshot(&b, api.SnapshotInfo{Record: rec, FilesError: "not resolved"}, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "recorded from:  pages both of 2 recording runs touched; runs overlap 0.812") {
		t.Errorf("snapshot show does not say how the manifest was recorded:\n%s", b.String())
	}
}

// TestSnapshotTextShowsThePacks: snapshot show names the startup pack built
// from the recorded manifest and the refined pack a restore streams
// instead, and --json carries both.
func TestSnapshotTextShowsThePacks(t *testing.T) {
	rec := repository.Record{ID: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
		Manifest:    &repository.ManifestDescriptor{SHA256: "aa", Size: 100},
		StartupPack: &repository.StartupPackDescriptor{ManifestSHA256: "aa", IndexSHA256: "cc", IndexSize: 64, StoredBytes: 3 << 20, LogicalBytes: 4 << 20},
		Refinement:  &repository.RefinementDescriptor{ManifestSHA256: "bb", Pages: 1404, Restores: 3},
		RefinedPack: &repository.StartupPackDescriptor{ManifestSHA256: "bb", IndexSHA256: "dd", IndexSize: 80, StoredBytes: 5 << 20, LogicalBytes: 6 << 20, Restores: 2}}
	var b strings.Builder
	if err := Snapshot(&b, api.SnapshotInfo{Record: rec, Files: &api.SnapshotFiles{}}, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"startup pack:      3.0 MiB stored, 4.0 MiB unpacked, of manifest sha256 aa, index sha256 cc (64 bytes)\n",
		"refined pack:      5.0 MiB stored, 6.0 MiB unpacked, of manifest sha256 bb, index sha256 dd (80 bytes), built after 2 restores\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("snapshot show:\n%s\nlacks %q", b.String(), want)
		}
	}
	var j strings.Builder
	if err := Snapshot(&j, api.SnapshotInfo{Record: rec}, true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"startup_pack": {`, `"refined_pack": {`, `"index_sha256": "dd"`, `"restores": 2`} {
		if !strings.Contains(j.String(), want) {
			t.Errorf("snapshot show --json:\n%s\nlacks %q", j.String(), want)
		}
	}
}
