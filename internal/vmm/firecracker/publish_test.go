package firecracker_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/lab/pagecache"
	"warmstart/internal/manifest"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/firecracker"
)

// TestPublishRecordRestoreThroughFake runs the production path of a
// Firecracker snapshot (capture → publish → background recording → restores
// on both devices with and without prefetch) against fake Firecracker
// processes. The fake maps guest memory as Firecracker does and reads a
// working set through the memory device, so the recorder sees real faults;
// the test checks the requests the driver sent at each step, the published
// record, the manifest recorded from the fake's reads, that each restored
// guest found the memory it was captured with, and that each stop leaves
// nothing behind.
func TestPublishRecordRestoreThroughFake(t *testing.T) {
	requireFUSE(t)
	const (
		pageBytes = 4096
		memMiB    = 16
	)
	// Out of order, with a run of adjacent pages, in both halves.
	touched := []int64{9 << 20, 0, 5 * pageBytes, 6 * pageBytes, 7 * pageBytes, 1 << 20, 15<<20 + 3*pageBytes}
	record := filepath.Join(t.TempDir(), "requests.jsonl")
	bin := firecracker.FakeBinary(t, firecracker.FakeConfig{Agent: true, RecordPath: record, TouchPages: touched})
	d, err := firecracker.New(firecracker.Options{
		Binary:       bin,
		EnvdAddress:  "unix:agent.sock",
		PollInterval: 2 * time.Millisecond,
		ReadyTimeout: 20 * time.Second,
		StopTimeout:  10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newPublishFlow(t, d, 30*time.Second)

	images := t.TempDir()
	spec := firecracker.BootSpec{
		Kernel: filepath.Join(images, "vmlinux"), Rootfs: filepath.Join(images, "rootfs.ext4"),
		RootfsReadOnly: true, MemoryMiB: memMiB,
	}
	for _, p := range []string{spec.Kernel, spec.Rootfs} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := f.publish(t, ctx, spec)
	token := agentToken(p.snap.Ready.Detail["agent_answer"])
	if token == "" {
		t.Fatalf("the booted agent answered %q, without a token", p.snap.Ready.Detail["agent_answer"])
	}

	// Boot, capture and the recording's restore.
	reqs := firecracker.ReadRecords(t, record)
	seen := firecracker.CheckRecords(t, firecracker.FakeNewestVersion, reqs)
	firecracker.RequireSeen(t, seen, "PUT /snapshot/create Full", "PUT /snapshot/load File")
	steps := inOrder(t, reqs,
		"PUT /machine-config", "PUT /drives/rootfs", "PUT /actions InstanceStart",
		"PATCH /vm Paused", "PUT /snapshot/create", "GET /machine-config",
		"PUT /snapshot/load", "PUT /actions SendCtrlAltDel")
	var mc firecracker.MachineConfig
	decode(t, steps[0], &mc)
	var drive firecracker.Drive
	decode(t, steps[1], &drive)
	if mc.MemSizeMiB != memMiB || drive.PathOnHost != spec.Rootfs || !drive.IsRootDevice || !drive.IsReadOnly {
		t.Errorf("booted with machine config %+v and drive %+v; want %d MiB and %s attached read-only as the root device", mc, drive, memMiB, spec.Rootfs)
	}
	var create firecracker.SnapshotCreate
	decode(t, steps[4], &create)
	staging := filepath.Dir(create.MemFilePath)
	if create.SnapshotType != firecracker.SnapshotFull || filepath.Dir(staging) != f.repo.Root() ||
		filepath.Base(create.MemFilePath) != repository.MemoryFileName ||
		!strings.HasPrefix(filepath.Base(staging), ".capture-") || filepath.Dir(create.SnapshotPath) != staging {
		t.Errorf("snapshot create %+v; want a Full snapshot into a staging directory in the store %s", create, f.repo.Root())
	}
	if slices.ContainsFunc(reqs, func(r firecracker.RecordedRequest) bool { return label(r) == "PATCH /vm Resumed" }) {
		t.Error("the captured VM was resumed; a capture for publishing stops it")
	}
	load := loadOf(t, steps[6])
	if load.MemBackend.BackendType != vmm.BackendFile || filepath.Dir(load.MemBackend.BackendPath) != f.traceDir ||
		load.SnapshotPath != p.resolved.VMStatePath || !load.ResumeVM {
		t.Errorf("the recording loaded %+v; want the published vm state %s with the File backend on the tracing mount %s, resumed",
			load, p.resolved.VMStatePath, f.traceDir)
	}

	// The manifest holds what the recorded restore read: first the page of
	// the generation ID, which the load writes before the guest runs, then
	// every page the fake guest touched.
	for _, off := range append([]int64{firecracker.FakeGenerationIDPage}, touched...) {
		if !slices.ContainsFunc(p.manifest.Ranges, func(r manifest.Range) bool { return r.Offset <= off && off < r.Offset+r.Length }) {
			t.Errorf("the manifest does not cover page %d: %v", off, p.manifest.Ranges)
		}
	}
	if first, off := p.manifest.Ranges[0], int64(firecracker.FakeGenerationIDPage); first.Offset > off || first.Offset+first.Length <= off {
		t.Errorf("the manifest starts with %+v, not with the generation ID's page %d, which the load wrote first", first, off)
	}

	for _, c := range restoreCases(t) {
		t.Run(c.name, func(t *testing.T) {
			before := len(firecracker.ReadRecords(t, record))
			inst := f.restoreOnce(t, ctx, p, c.opts)
			checkPrefetch(t, p, c.opts, inst)
			if got := agentToken(inst.Ready.Detail["agent_answer"]); got != token {
				t.Errorf("restored agent answered %q; the captured guest drew token %s", inst.Ready.Detail["agent_answer"], token)
			}
			reqs := firecracker.ReadRecords(t, record)[before:]
			firecracker.CheckRecords(t, firecracker.FakeNewestVersion, reqs)
			want := []string{"PUT /snapshot/load", "PUT /actions SendCtrlAltDel"}
			paused := c.opts.Policy.BeforeStart && c.opts.Prefetch != restore.ModeOff
			if paused {
				want = []string{"PUT /snapshot/load", "PATCH /vm Resumed", "PUT /actions SendCtrlAltDel"}
			}
			load := loadOf(t, inOrder(t, reqs, want...)[0])
			if load.SnapshotPath != p.resolved.VMStatePath || load.ResumeVM == paused {
				t.Errorf("loaded %+v; want the published vm state %s, resume_vm %v", load, p.resolved.VMStatePath, !paused)
			}
			switch backend := load.MemBackend; c.opts.Device {
			case config.DeviceFile:
				if backend.BackendType != vmm.BackendFile || filepath.Dir(backend.BackendPath) != f.serving.Dir() {
					t.Errorf("memory backend %+v; want the File backend on the serving FUSE mount %s", backend, f.serving.Dir())
				}
			case config.DeviceUffd:
				if backend.BackendType != vmm.BackendUffd || filepath.Base(backend.BackendPath) != "uffd.sock" ||
					!strings.HasPrefix(backend.BackendPath, filepath.Join(f.run, "restores")+"/") {
					t.Errorf("memory backend %+v; want the Uffd backend on the handler's socket in the restore's directory", backend)
				}
			}
		})
	}

	// Guest writes stay in the VMM's private copies.
	if sum, err := pagecache.HashFile(p.resolved.MemoryPath); err != nil || sum != p.resolved.Record.MemorySHA256 {
		t.Errorf("memory lower file sha256 %s (%v) after the restores, published as %s", sum, err, p.resolved.Record.MemorySHA256)
	}
}

// label names a request as CheckRecords does, with the path as sent.
func label(r firecracker.RecordedRequest) string {
	l := r.Method + " " + r.Path
	var body struct {
		ActionType string `json:"action_type"`
		State      string `json:"state"`
	}
	_ = json.Unmarshal(r.Body, &body)
	for _, v := range []string{body.ActionType, body.State} {
		if v != "" {
			l += " " + v
		}
	}
	return l
}

// inOrder finds want's requests in reqs in that order, each after the one
// before, and returns them.
func inOrder(t *testing.T, reqs []firecracker.RecordedRequest, want ...string) []firecracker.RecordedRequest {
	t.Helper()
	var found []firecracker.RecordedRequest
	i := 0
	for _, w := range want {
		for i < len(reqs) && label(reqs[i]) != w {
			i++
		}
		if i == len(reqs) {
			labels := make([]string, len(reqs))
			for j, r := range reqs {
				labels[j] = label(r)
			}
			t.Fatalf("requests %q do not include %q in order %q", labels, w, want)
		}
		found = append(found, reqs[i])
		i++
	}
	return found
}

func decode(t *testing.T, r firecracker.RecordedRequest, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("%s %s body %s: %v", r.Method, r.Path, r.Body, err)
	}
}

func loadOf(t *testing.T, r firecracker.RecordedRequest) firecracker.SnapshotLoad {
	t.Helper()
	var l firecracker.SnapshotLoad
	decode(t, r, &l)
	return l
}
