package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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
		"access_key_id = %q\nsecret_access_key = %q\ncache_dir = %q\n"+noRecording,
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
			Device string                  `json:"device"`
			Ready  struct{ SHA256 string } `json:"ready"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &info); err != nil {
			t.Fatalf("restore --device %s --json printed %q: %v", device, r.stdout, err)
		}
		if info.Device != device || info.Ready.SHA256 != want {
			t.Errorf("restore --device %s: device %q, guest read sha256 %s; want %s", device, info.Device, info.Ready.SHA256, want)
		}
	}
	if ms := mountPointsBelow(t, run); len(ms) > 0 {
		t.Errorf("still mounted after the verbs exited: %v", ms)
	}
	// A verb that exits has finished writing what it cached: no block
	// file is left half-way, for the next verb to discard with a warning.
	if left := cacheTempFiles(t, filepath.Join(root.dir, "cache")); len(left) > 0 {
		t.Errorf("the node cache holds temporary block files after the verbs exited: %v", left)
	}
}

// cacheTempFiles are the block files being written (".tmp-…") below dir.
func cacheTempFiles(t *testing.T, dir string) []string {
	t.Helper()
	var left []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), ".tmp-") {
			left = append(left, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return left
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

// TestS3RestoreLeavesNoHalfWrittenBlocks restores a snapshot with a
// startup pack, as README's S3 block does, and checks after each verb
// exits that the node cache holds no block file still being written: a
// verb finishes writing what it cached before it exits, or the next verb
// discards the file with a warning that a write was interrupted.
func TestS3RestoreLeavesNoHalfWrittenBlocks(t *testing.T) {
	srv := miniotest.Start(t)
	const bucket = "no-half-written"
	if err := srv.MakeBucket(context.Background(), bucket); err != nil {
		t.Fatal(err)
	}
	root := newCLIRoot(t, "wsh3-", 12)
	cache := filepath.Join(root.dir, "cache")
	text := fmt.Sprintf("[runtime]\ndir = %q\n[snapshot]\nrepository_backend = \"s3\"\n"+
		"[backend.s3]\nendpoint = %q\nbucket = %q\naccess_key_id = %q\nsecret_access_key = %q\ncache_dir = %q\n"+
		"[vmm]\ndriver = \"replay\"\n[replay]\ntrace = %q\n",
		root.run, "http://"+srv.Endpoint, bucket, miniotest.AccessKey, miniotest.SecretKey, cache, root.ref.Trace)
	if err := os.WriteFile(root.cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	ref := root.ref
	if r := runCLI(t, "--config", root.cfg, "snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory,
		"--alias", "ref", "--layout", root.layout); r.code != 0 {
		t.Fatalf("import with recording: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	for i := range 3 {
		r := runCLI(t, "--config", root.cfg, "restore", "ref")
		if r.code != 0 {
			t.Fatalf("restore %d: exit %d, stderr:\n%s", i+1, r.code, r.stderr)
		}
		if strings.Contains(r.stderr, "interrupted write") {
			t.Errorf("restore %d discarded what an earlier verb left half-written:\n%s", i+1, r.stderr)
		}
		if left := cacheTempFiles(t, cache); len(left) > 0 {
			t.Errorf("after restore %d the node cache holds temporary block files: %v", i+1, left)
		}
	}
}
