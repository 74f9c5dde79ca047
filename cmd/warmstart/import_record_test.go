package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/lab/synth"
	"warmstart/internal/repository/posixfs"
)

// TestSnapshotImportRecordsWhenEnabled: with
// [snapshot.memory_startup_pack] enabled = true, an in-process import
// records the startup manifest and waits for it, as capture does, saying
// so on standard error; the snapshot has its manifest when the verb ends.
func TestSnapshotImportRecordsWhenEnabled(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("recording needs the FUSE device: %v", err)
	}
	dir, err := os.MkdirTemp("", "wsi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ref, err := synth.Generate(context.Background(), synth.Options{MemoryBytes: 8 << 20, Seed: 7, Dir: filepath.Join(dir, "ref")})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(ref.Layout)
	if err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(dir, "store")
	cfg := filepath.Join(dir, "warmstart.toml")
	text := "[snapshot.memory_startup_pack]\nenabled = true\n[runtime]\ndir = \"" + filepath.Join(dir, "run") +
		"\"\n[backend.posix_fs]\nsnapshot_store = \"" + store + "\"\n[vmm]\ndriver = \"replay\"\n[replay]\ntrace = \"" + ref.Trace + "\"\n"
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runVerb(t, "--config", cfg, "snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory,
		"--layout", strings.TrimSpace(string(spec)))
	if err != nil {
		t.Fatalf("import: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "recording the startup manifest") || !strings.Contains(stderr, "attached startup manifest") {
		t.Errorf("import said on stderr %q, want the recording's progress", stderr)
	}
	repo, err := posixfs.Open(store, posixfs.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := repo.Get(context.Background(), strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Manifest == nil {
		t.Error("the imported snapshot has no startup manifest when import returns")
	}
	// Had this process died before the attach, a daemon would resume the
	// recording: the record must say one was asked for.
	if !rec.ManifestRequested {
		t.Error("the record of an import that records its manifest lacks manifest_requested")
	}
}
