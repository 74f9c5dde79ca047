package restore_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/restore"
)

// TestManifestRejectionFallsBackToOnDemand restores with a manifest broken
// in each way the restore path must reject: each restore reads correct
// memory on demand, reports prefetch skipped with the failure named, and
// logs one line naming the snapshot and the reason.
func TestManifestRejectionFallsBackToOnDemand(t *testing.T) {
	e := newEnv(t, envOptions{})
	good := e.source(t)
	cases := brokenManifests(t, good)
	for _, device := range devices {
		for _, c := range cases {
			t.Run(device+"/"+c.name, func(t *testing.T) { e.checkRejected(t, good, device, c) })
		}
		t.Run(device+"/valid", func(t *testing.T) { e.checkValidManifest(t, good, device) })
	}
}

// rejectionCase is one way a manifest can be broken and how the restorer
// must name it.
type rejectionCase struct {
	name   string
	path   string
	desc   *manifest.Descriptor
	reason string // the reason's name, as the restorer reports it
	detail string // what the logged reason must also say
}

// brokenManifests writes, next to a copy of good's manifest, each broken
// manifest the restore path must reject.
func brokenManifests(t *testing.T, good restore.Source) []rejectionCase {
	t.Helper()
	data, err := os.ReadFile(good.ManifestPath)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	modified := func(f func(b []byte)) []byte {
		b := append([]byte(nil), data...)
		f(b)
		return b
	}
	truncated := data[:len(data)-5]
	badMagic := modified(func(b []byte) { b[0] ^= 0xff })
	// Same size, one byte of the last range changed: only the digest tells.
	flipped := modified(func(b []byte) { b[len(b)-9] ^= 0x01 })
	foreignData := foreignLayoutManifest(t)
	oversize, symlink := oversizeAndSymlink(t, dir, good.ManifestPath)
	describe := func(b []byte) *manifest.Descriptor { d := manifest.Describe(b); return &d }
	return []rejectionCase{
		{"missing", filepath.Join(dir, "absent"), good.Manifest, "missing", "no such file"},
		{"truncated file", write("truncated-file", truncated), good.Manifest, "size", "size mismatch"},
		{"truncated encoding", write("truncated", truncated), describe(truncated), "corrupt", "truncated"},
		{"corrupt bytes", write("bad-magic", badMagic), describe(badMagic), "corrupt", "magic"},
		{"size mismatch", good.ManifestPath, &manifest.Descriptor{SHA256: good.Manifest.SHA256, Size: good.Manifest.Size + 1}, "size", "size mismatch"},
		{"digest mismatch", write("flipped", flipped), good.Manifest, "digest", "digest mismatch"},
		{"layout mismatch", write("foreign", foreignData), describe(foreignData), "layout", "another memory layout"},
		{"oversize", oversize, &manifest.Descriptor{SHA256: good.Manifest.SHA256, Size: manifest.MaxEncodedBytes + 1}, "oversize", "too large"},
		{"directory", dir, good.Manifest, "not_regular", "it is a directory"},
		{"symlink", symlink, good.Manifest, "not_regular", "it is a symlink"},
	}
}

// foreignLayoutManifest encodes a valid manifest for a memory layout of
// two regions, which the reference snapshot does not have.
func foreignLayoutManifest(t *testing.T) []byte {
	t.Helper()
	halves := layout.Layout{FileSize: memoryBytes, Regions: []layout.Region{
		{Offset: 0, Size: memoryBytes / 2, PageSize: layout.DefaultPageSize},
		{Offset: memoryBytes / 2, Size: memoryBytes / 2, PageSize: layout.DefaultPageSize},
	}}
	foreign, err := manifest.Build(halves, []int64{0, 4096, memoryBytes / 2})
	if err != nil {
		t.Fatal(err)
	}
	foreignData, err := manifest.Encode(foreign)
	if err != nil {
		t.Fatal(err)
	}
	return foreignData
}

// oversizeAndSymlink makes in dir a sparse file one byte over the manifest
// size limit and a symlink to target.
func oversizeAndSymlink(t *testing.T, dir, target string) (oversize, symlink string) {
	t.Helper()
	oversize = filepath.Join(dir, "oversize")
	if err := os.WriteFile(oversize, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(oversize, manifest.MaxEncodedBytes+1); err != nil {
		t.Fatal(err)
	}
	// Even a link to the valid manifest: the restore reads only what the
	// repository stored, never what a link points it to.
	symlink = filepath.Join(dir, "symlink")
	if err := os.Symlink(target, symlink); err != nil {
		t.Fatal(err)
	}
	return oversize, symlink
}

// checkRejected restores with c's manifest: the guest reads correct memory
// on demand, prefetch is skipped with the reason named, no prefetch task
// starts, and one log line names the snapshot and the reason.
func (e *env) checkRejected(t *testing.T, good restore.Source, device string, c rejectionCase) {
	src := good
	src.ManifestPath, src.Manifest = c.path, c.desc
	before := e.restorer.Engine.Stats()
	e.log.Take()
	inst := e.restore(t, e.restorer, src, restore.Options{Device: device, Prefetch: restore.ModeOn})
	checkHash(t, inst, e.ref.expected)
	if p := inst.Prefetch; p.State != "skipped" || !strings.Contains(p.Reason, "("+c.reason+")") || !strings.Contains(p.Reason, c.detail) {
		t.Errorf("prefetch report %+v: want skipped, reason naming %q and saying %q", p, c.reason, c.detail)
	}
	if got := e.observer.lastRejected(); got != c.reason {
		t.Errorf("observer told rejection %q, want %q", got, c.reason)
	}
	if after := e.restorer.Engine.Stats(); after.TasksStarted != before.TasksStarted {
		t.Errorf("a prefetch task started for a rejected manifest")
	}
	checkOneLogLine(t, e.log.Take(), e.id, c.detail)
	stop(t, inst)
}

// checkValidManifest: the untouched manifest is accepted and logs nothing.
func (e *env) checkValidManifest(t *testing.T, good restore.Source, device string) {
	e.log.Take()
	inst := e.restore(t, e.restorer, good, restore.Options{Device: device, Prefetch: restore.ModeOn})
	checkHash(t, inst, e.ref.expected)
	if p := inst.Prefetch; p.State == "skipped" || p.State == "failed" {
		t.Errorf("valid manifest: prefetch %s: %s", p.State, p.Reason)
	}
	if lines := e.log.Take(); len(lines) != 0 {
		t.Errorf("valid manifest logged %q", lines)
	}
	stop(t, inst)
}

// checkOneLogLine fails unless lines hold exactly one line, naming the
// snapshot and giving a reason that says detail.
func checkOneLogLine(t *testing.T, lines []string, snapshot, detail string) {
	t.Helper()
	if len(lines) != 1 {
		t.Errorf("logged %d lines, want 1: %q", len(lines), lines)
		return
	}
	if l := lines[0]; !strings.Contains(l, "snapshot="+snapshot) || !strings.Contains(l, "reason=") || !strings.Contains(l, detail) {
		t.Errorf("log line %q does not name snapshot %s and a reason saying %q", l, snapshot, detail)
	}
}

// TestSnapshotWithoutManifestRestoresAsBefore: no manifest, no prefetch,
// nothing logged, correct memory.
func TestSnapshotWithoutManifestRestoresAsBefore(t *testing.T) {
	e := newEnv(t, envOptions{noManifest: true})
	e.restorer.ConsumeEnabled = true
	src := e.source(t)
	if src.Manifest != nil || src.ManifestPath != "" {
		t.Fatalf("snapshot published without recording has manifest %+v at %q", src.Manifest, src.ManifestPath)
	}
	for _, device := range devices {
		for _, mode := range []restore.Mode{restore.ModeAuto, restore.ModeOn} {
			e.log.Take()
			inst := e.restore(t, e.restorer, src, restore.Options{Device: device, Prefetch: mode})
			checkHash(t, inst, e.ref.expected)
			if p := inst.Prefetch; p.State != "skipped" || !strings.Contains(p.Reason, "no startup manifest") {
				t.Errorf("%s prefetch %s: report %+v, want skipped for having no manifest", device, mode, p)
			}
			if lines := e.log.Take(); len(lines) != 0 {
				t.Errorf("%s prefetch %s: logged %q for a snapshot that never had a manifest", device, mode, lines)
			}
			stop(t, inst)
		}
	}
	if n := e.restorer.Engine.Stats().TasksStarted; n != 0 {
		t.Errorf("%d prefetch tasks started without a manifest", n)
	}
}

// TestConsumeDisabledSkipsValidManifest: with consume_enabled off, auto
// mode does not prefetch even though the manifest is valid; on and a
// consume_enabled restorer do.
func TestConsumeDisabledSkipsValidManifest(t *testing.T) {
	e := newEnv(t, envOptions{})
	src := e.source(t)
	for _, device := range devices {
		for _, c := range []struct {
			consume  bool
			mode     restore.Mode
			prefetch bool
		}{
			{false, restore.ModeAuto, false},
			{true, restore.ModeAuto, true},
			{false, restore.ModeOn, true},
			{true, restore.ModeOff, false},
		} {
			e.restorer.ConsumeEnabled = c.consume
			before := e.restorer.Engine.Stats().TasksStarted
			inst := e.restore(t, e.restorer, src, restore.Options{Device: device, Prefetch: c.mode})
			checkHash(t, inst, e.ref.expected)
			p := inst.Prefetch
			started := e.restorer.Engine.Stats().TasksStarted - before
			if c.prefetch && (p.State == "skipped" || started != 1) {
				t.Errorf("%s consume_enabled=%v prefetch %s: report %+v, %d tasks started; want a prefetch", device, c.consume, c.mode, p, started)
			}
			if !c.prefetch && (p.State != "skipped" || started != 0) {
				t.Errorf("%s consume_enabled=%v prefetch %s: report %+v, %d tasks started; want skipped", device, c.consume, c.mode, p, started)
			}
			if !c.consume && c.mode == restore.ModeAuto && !strings.Contains(p.Reason, "on_restore") {
				t.Errorf("%s: skip reason %q does not name on_restore", device, p.Reason)
			}
			stop(t, inst)
		}
	}
}
