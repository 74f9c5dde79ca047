package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/lab/miniotest"
	"warmstart/internal/lab/synth"
	"warmstart/internal/trace"
	"warmstart/internal/vmm/replay"
)

// TestRestoreUffdOfAnS3Snapshot runs "warmstart restore --device uffd" of
// a snapshot in an S3 repository (a real MinIO): the uffd device serves
// the memory through the node cache, checked against the snapshot's
// digest table, and the guest reads exactly the published memory (the
// replay VMM's hash over every byte it read). The file device restores
// the same snapshot with the same hash.
func TestRestoreUffdOfAnS3Snapshot(t *testing.T) {
	srv := miniotest.Start(t)
	const bucket = "restore-uffd"
	if err := srv.MakeBucket(context.Background(), bucket); err != nil {
		t.Fatal(err)
	}
	// A short root (the uffd socket lies in the verb's runtime
	// directory), its configuration naming the bucket instead of a store.
	root := newCLIRoot(t, "wsu3-", 11)
	want := expectedHash(t, root.ref)
	text := fmt.Sprintf("[runtime]\ndir = %q\n[snapshot]\nrepository_backend = \"s3\"\n"+
		"[backend.s3]\nendpoint = %q\nbucket = %q\nregion = \"us-east-1\"\naddressing_style = \"path\"\n"+
		"access_key_id = %q\nsecret_access_key = %q\ncache_dir = %q\n",
		root.run, "http://"+srv.Endpoint, bucket, miniotest.AccessKey, miniotest.SecretKey, filepath.Join(root.dir, "cache"))
	if err := os.WriteFile(root.cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, ref, run := root.cfg, root.ref, root.run
	if _, _, err := runVerb(t, "--config", cfg, "snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory,
		"--alias", "remote", "--layout", root.layout); err != nil {
		t.Fatalf("import into S3: %v", err)
	}
	for _, device := range []string{"uffd", "file"} {
		r := runCLI(t, "--config", cfg, "restore", "remote", "--device", device, "--vmm", "replay", "--trace", ref.Trace, "--json")
		if r.code != 0 {
			t.Fatalf("restore --device %s of an S3 snapshot: exit %d, stderr:\n%s", device, r.code, r.stderr)
		}
		var info struct {
			Device string            `json:"device"`
			Ready  map[string]string `json:"ready"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
			t.Fatalf("restore --device %s --json printed %q: %v", device, r.stdout, err)
		}
		if info.Device != device || info.Ready["sha256"] != want {
			t.Errorf("restore --device %s: device %q, guest read sha256 %s; want %s", device, info.Device, info.Ready["sha256"], want)
		}
	}
	if ms := mountPointsBelow(t, run); len(ms) > 0 {
		t.Errorf("still mounted after the verbs exited: %v", ms)
	}
}

// expectedHash is the replay VMM's hash over ref's memory when it plays
// ref's trace and every byte it reads is right.
func expectedHash(t *testing.T, ref synth.Paths) string {
	t.Helper()
	entries, err := trace.ReadFile(ref.Trace)
	if err != nil {
		t.Fatal(err)
	}
	want, err := replay.ExpectedHash(ref.Memory, entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	return want
}
