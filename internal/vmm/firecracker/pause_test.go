package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"warmstart/internal/layout"
	"warmstart/internal/vmm"
)

// TestDiffPerVersion, against the fake playing each supported release: a
// pausable restore asks for dirty page tracking under the name the release
// knows, and its Diff holds exactly the pages written since the load (the
// generation ID's and the guest's). A restore without tracking: every
// release refuses a create on the running VM; SaveDiff refuses it without
// asking; asked for a Diff anyway, 1.12 refuses it and later releases
// write the pages resident in the mapping (mincore), as Firecracker does.
func TestDiffPerVersion(t *testing.T) {
	for _, version := range fakeVersions {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			diffPerVersion(t, version)
		})
	}
}

func diffPerVersion(t *testing.T, version string) {
	ctx := testContext(t)
	v, _ := ParseVersion(version)
	const memMiB = 8
	vmState, mem := writeFakeSnapshot(t, t.TempDir(), memMiB, "token", []int64{1 << 20})
	record := filepath.Join(t.TempDir(), "requests.jsonl")
	d := newTestDriver(t, fakeConfig{Version: version, Agent: true, RecordPath: record}, nil)
	restoreOf := func(pausable bool) *Machine {
		l := layout.Layout{FileSize: memMiB << 20, Regions: []layout.Region{{Size: memMiB << 20, PageSize: 4096}}}
		m, err := d.RestoreMachine(ctx, vmm.RestoreSpec{SnapshotID: "s", VMStatePath: vmState, Backend: vmm.BackendFile,
			MemPath: mem, Layout: l, RuntimeDir: t.TempDir(), Pausable: pausable}, RestoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.stopNow(context.Background(), KillCanceled) })
		if _, err := m.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		return m
	}

	m := restoreOf(true)
	load := lastLoad(t, readRecords(t, record))
	if tracked := load.TrackDirtyPages || load.EnableDiffSnapshots; !tracked || (load.TrackDirtyPages != v.AtLeast(trackDirtyPagesSince)) {
		t.Errorf("a pausable restore on %s loaded %+v; want dirty page tracking under the name %s knows", version, load, version)
	}
	const written = 5 << 20
	if err := guestWrite(ctx, m, written, 7); err != nil {
		t.Fatal(err)
	}
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	diff, err := m.SaveDiff(ctx, vmm.DiffSpec{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := filePages(t, diff.MemoryDiffPath), []int64{generationIDPage / 4096, written / 4096}; !slices.Equal(got, want) {
		t.Errorf("the Diff holds pages %v; want %v, the generation ID's and the guest's", got, want)
	}
	checkRecords(t, version, readRecords(t, record))

	m = restoreOf(false)
	var apiErr *APIError
	err = m.client.CreateSnapshot(ctx, SnapshotCreate{SnapshotType: SnapshotFull, SnapshotPath: filepath.Join(t.TempDir(), "s"), MemFilePath: filepath.Join(t.TempDir(), "m")})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.HasSuffix(apiErr.FaultMessage, "save/restore unavailable while running") {
		t.Errorf("a create on the running VM: %v; want Firecracker's 400", err)
	}
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	before := len(readRecords(t, record))
	if _, err := m.SaveDiff(ctx, vmm.DiffSpec{Dir: t.TempDir()}); !errors.Is(err, ErrNotTracking) || len(readRecords(t, record)) != before {
		t.Errorf("SaveDiff of a VM without tracking: %v, with %d requests sent; want ErrNotTracking, none sent", err, len(readRecords(t, record))-before)
	}
	memPath := filepath.Join(t.TempDir(), "memory.diff")
	err = m.client.CreateSnapshot(ctx, SnapshotCreate{SnapshotType: SnapshotDiff, SnapshotPath: filepath.Join(t.TempDir(), "s"), MemFilePath: memPath})
	if !v.AtLeast(mincoreDiffSince) {
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.FaultMessage, "Diff snapshots are not allowed on uVMs with dirty page tracking disabled") {
			t.Errorf("a Diff without tracking on %s: %v; want Firecracker's refusal", version, err)
		}
		return
	}
	if err != nil {
		t.Fatalf("a Diff without tracking on %s: %v; from 1.13 it takes the resident pages", version, err)
	}
	if got := filePages(t, memPath); !slices.Contains(got, generationIDPage/4096) {
		t.Errorf("a Diff by mincore holds pages %v, not the generation ID's, which the load wrote", got)
	}
}

// lastLoad is the body of the last snapshot load in records.
func lastLoad(t *testing.T, records []recordedRequest) SnapshotLoad {
	t.Helper()
	var l SnapshotLoad
	for _, r := range records {
		if r.Path == "/snapshot/load" {
			l = SnapshotLoad{}
			if err := json.Unmarshal(r.Body, &l); err != nil {
				t.Fatal(err)
			}
		}
	}
	return l
}

func filePages(t *testing.T, path string) []int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pages, err := dataPages(f)
	if err != nil {
		t.Fatal(err)
	}
	return pages
}
