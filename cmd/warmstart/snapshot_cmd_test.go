package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"warmstart/internal/api"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/repotest"
)

// runSnapshotVerb runs "warmstart snapshot ARGS... --store store" in this
// process and returns its stdout, stderr and error. Flag values live in
// package variables, so they are reset to their defaults first.
func runSnapshotVerb(t *testing.T, store string, args ...string) (string, string, error) {
	t.Helper()
	for _, c := range append([]*cobra.Command{snapshotCmd}, snapshotCmd.Commands()...) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				_ = f.Value.Set(f.DefValue)
				f.Changed = false
			})
		}
	}
	var stdout, stderr bytes.Buffer
	rootCmd.SetOut(&stdout)
	rootCmd.SetErr(&stderr)
	rootCmd.SetArgs(append(append([]string{"snapshot"}, args...), "--store", store))
	t.Cleanup(func() { rootCmd.SetOut(nil); rootCmd.SetErr(nil); rootCmd.SetArgs(nil) })
	err := rootCmd.ExecuteContext(context.Background())
	return stdout.String(), stderr.String(), err
}

func TestSnapshotVerbs(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	in := repotest.NewInputs(t, 2<<20)
	id := importAndListLocally(t, store, in)
	// Attach a manifest the way the recorder will, then look again.
	desc := attachManifestBytes(t, store, id)
	checkListedWithManifest(t, store, desc)
	checkShown(t, store, id, in, desc)
	deleteLocally(t, store, id)
}

// importAndListLocally imports in as web-1, checks the progress, that the
// alias cannot be imported again and the listing; it returns the id.
func importAndListLocally(t *testing.T, store string, in repotest.Inputs) string {
	t.Helper()
	out, progress, err := runSnapshotVerb(t, store, "import", "--vm-state", in.VMStatePath, "--memory", in.MemoryPath, "--alias", "web-1", "--layout", "0:1MiB,1MiB:1MiB")
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	id := strings.TrimSpace(out)
	if err := repository.ValidateID(id); err != nil {
		t.Fatalf("import printed %q: %v", out, err)
	}
	if !strings.Contains(progress, "memory.bin: verify 2.0 MiB of 2.0 MiB") {
		t.Errorf("import progress on stderr: %q", progress)
	}

	_, _, err = runSnapshotVerb(t, store, "import", "--vm-state", in.VMStatePath, "--memory", in.MemoryPath, "--alias", "web-1")
	if !errors.Is(err, repository.ErrAliasConflict) || !strings.Contains(err.Error(), id) {
		t.Fatalf("second import of the alias: %v", err)
	}

	out, _, err = runSnapshotVerb(t, store, "list")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], id) || !strings.Contains(lines[1], "web-1") ||
		!strings.Contains(lines[1], "2.0 MiB") || !strings.HasSuffix(lines[1], "no") {
		t.Fatalf("list:\n%s", out)
	}
	return id
}

// attachManifestBytes attaches a manifest to snapshot id in store directly
// through the repository, as the recorder does.
func attachManifestBytes(t *testing.T, store, id string) repository.ManifestDescriptor {
	t.Helper()
	repo, err := posixfs.Open(store, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := repo.LeaseExisting(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := repo.AttachManifest(context.Background(), lease, []byte("manifest bytes"), nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.End()
	return desc
}

// checkListedWithManifest: list --json shows the attached manifest under
// a matching alias prefix and nothing under another.
func checkListedWithManifest(t *testing.T, store string, desc repository.ManifestDescriptor) {
	t.Helper()
	out, _, err := runSnapshotVerb(t, store, "list", "--json", "--alias-prefix", "web")
	if err != nil {
		t.Fatal(err)
	}
	var recs []repository.Record
	if err := json.Unmarshal([]byte(out), &recs); err != nil || len(recs) != 1 || recs[0].Manifest == nil || recs[0].Manifest.SHA256 != desc.SHA256 {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	out, _, err = runSnapshotVerb(t, store, "list", "--json", "--alias-prefix", "db")
	if err != nil || strings.TrimSpace(out) != "[]" {
		t.Fatalf("list --json with no match: %q, %v", out, err)
	}
}

// checkShown: show, by alias and as JSON by id, names the snapshot, its
// digests, layout and files; a missing or bad name is an error.
func checkShown(t *testing.T, store, id string, in repotest.Inputs, desc repository.ManifestDescriptor) {
	t.Helper()
	out, _, err := runSnapshotVerb(t, store, "show", "web-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{id, "web-1", in.MemorySHA256, desc.SHA256, "0:1048576:4096,1048576:1048576:4096", "memory.bin"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	out, _, err = runSnapshotVerb(t, store, "show", id, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var shown api.SnapshotInfo
	if err := json.Unmarshal([]byte(out), &shown); err != nil || shown.ID != id || shown.Manifest == nil || shown.Files == nil ||
		repotest.FileSHA256(t, shown.Files.Memory) != in.MemorySHA256 {
		t.Fatalf("show --json: %v\n%s", err, out)
	}

	_, _, err = runSnapshotVerb(t, store, "show", "nope")
	if err == nil || err.Error() != "snapshot show nope: not found" {
		t.Fatalf("show of a missing alias: %v", err)
	}
	_, _, err = runSnapshotVerb(t, store, "show", "../etc")
	var ue usageError
	if !errors.As(err, &ue) || !errors.Is(err, repository.ErrInvalidRequest) {
		t.Fatalf("show of a bad name: %v", err)
	}
}

// deleteLocally deletes web-1, then checks a second delete by alias or id
// has nothing to do and the listing is empty.
func deleteLocally(t *testing.T, store, id string) {
	t.Helper()
	out, _, err := runSnapshotVerb(t, store, "delete", "web-1")
	if err != nil || strings.TrimSpace(out) != "deleted snapshot "+id+" (alias web-1)" {
		t.Fatalf("delete: %q, %v", out, err)
	}
	out, _, err = runSnapshotVerb(t, store, "delete", "web-1")
	if err != nil || !strings.Contains(out, "nothing to delete") {
		t.Fatalf("second delete by alias: %q, %v", out, err)
	}
	out, _, err = runSnapshotVerb(t, store, "delete", id)
	if err != nil || !strings.Contains(out, "does not exist; nothing to delete") {
		t.Fatalf("second delete by id: %q, %v", out, err)
	}
	out, _, err = runSnapshotVerb(t, store, "list")
	if err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("list after delete: %q, %v", out, err)
	}
}

func TestSnapshotImportUsageErrors(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	in := repotest.NewInputs(t, 64<<10)
	cases := map[string][]string{
		"no memory":           {"import", "--vm-state", in.VMStatePath},
		"bad alias":           {"import", "--vm-state", in.VMStatePath, "--memory", in.MemoryPath, "--alias", "a/b"},
		"layout past the end": {"import", "--vm-state", in.VMStatePath, "--memory", in.MemoryPath, "--layout", "0:1MiB"},
		"extra argument":      {"import", "--vm-state", in.VMStatePath, "--memory", in.MemoryPath, "extra"},
	}
	for name, args := range cases {
		_, _, err := runSnapshotVerb(t, store, args...)
		var ue usageError
		if !errors.As(err, &ue) {
			t.Errorf("%s: got %v, want a usage error", name, err)
		}
	}
	// Usage errors are refused before the store is even opened.
	if _, err := os.Lstat(store); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("rejected imports created the store: %v", err)
	}
}

// snapshot delete of an alias whose snapshot no longer exists (a delete
// that crashed after removing the record) releases the alias and says so;
// a name that can be neither an id nor an alias is a usage error.
func TestSnapshotDeleteOfADanglingAlias(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	in := repotest.NewInputs(t, 64<<10)
	out, _, err := runSnapshotVerb(t, store, "import", "--vm-state", in.VMStatePath, "--memory", in.MemoryPath, "--alias", "ghost")
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	id := strings.TrimSpace(out)
	if err := os.Remove(filepath.Join(store, "catalog", "records", id+".json")); err != nil {
		t.Fatal(err)
	}
	out, _, err = runSnapshotVerb(t, store, "delete", "ghost")
	want := "alias ghost named snapshot " + id + ", which no longer exists; released the alias\n"
	if err != nil || out != want {
		t.Fatalf("delete of a dangling alias: %q, %v; want %q", out, err, want)
	}
	if _, err := os.Lstat(filepath.Join(store, "catalog", "aliases", "ghost")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the alias file stays after its release: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(store, "snapshots", id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the missing snapshot's files stay: %v", err)
	}
	out, _, err = runSnapshotVerb(t, store, "delete", "ghost")
	if err != nil || out != "no snapshot has alias ghost; nothing to delete\n" {
		t.Fatalf("second delete: %q, %v", out, err)
	}
	for _, bad := range []string{"Bad/Name", "../etc", "00000000-0000-4000-8000-000000000000"} {
		_, _, err := runSnapshotVerb(t, store, "delete", bad)
		var ue usageError
		if !errors.As(err, &ue) || !errors.Is(err, repository.ErrInvalidRequest) || !strings.Contains(err.Error(), bad) {
			t.Errorf("delete %q: %v; want a usage error naming it", bad, err)
		}
	}
}

// TestMalformedReferenceIsAUsageError gives every verb that looks a
// snapshot up by reference a name that can be neither an id nor an alias:
// each exits 2, as a shell expects of a badly called command, and says why,
// before it opens the store (here one that exists but holds no catalog).
func TestMalformedReferenceIsAUsageError(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	tooLong := strings.Repeat("x", 129)
	for _, verb := range [][]string{{"snapshot", "show"}, {"snapshot", "verify"}, {"snapshot", "delete"}} {
		for ref, want := range map[string]string{"": "argument is empty", tooLong: "must be 1 to 128 characters"} {
			r := runCLI(t, append(verb, ref, "--store", store)...)
			if r.code != 2 || !strings.Contains(r.stderr, want) {
				t.Errorf("%s %.10q: exit %d, stderr %q; want exit 2 and %q", strings.Join(verb, " "), ref, r.code, r.stderr, want)
			}
		}
	}
	// manifest inspect takes a file too: only an empty argument is a
	// malformed call; a name that is neither a file nor a reference is a
	// file not found (exit 1).
	for _, verb := range []string{"inspect", "show"} {
		if r := runCLI(t, "manifest", verb, "", "--store", store); r.code != 2 || !strings.Contains(r.stderr, "argument is empty") {
			t.Errorf("manifest %s \"\": exit %d, stderr %q; want exit 2 saying the argument is empty", verb, r.code, r.stderr)
		}
		if r := runCLI(t, "manifest", verb, "missing.json", "--store", store); r.code != 1 || !strings.Contains(r.stderr, "no such file") {
			t.Errorf("manifest %s missing.json: exit %d, stderr %q; want exit 1 saying there is no such file", verb, r.code, r.stderr)
		}
	}
	if entries, err := os.ReadDir(store); err != nil || len(entries) != 0 {
		t.Errorf("the store holds %v (%v) after calls refused before opening it", entries, err)
	}
}

// restores stop refuses an argument that cannot be a restore id before it
// dials the daemon: a path-like one once met the daemon's URL routing and
// came back as "405 method not allowed".
func TestRestoresStopRefusesABadID(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	for _, id := range []string{".", "a/b", "", "..", strings.Repeat("x", 129)} {
		r := runCLI(t, "--daemon", sock, "restores", "stop", id)
		if r.code != 2 || !strings.Contains(r.stderr, "restore id") {
			t.Errorf("restores stop %.10q: exit %d, stderr %q; want exit 2 naming the restore id", id, r.code, r.stderr)
		}
	}
}
