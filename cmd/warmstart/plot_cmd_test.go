package main

import (
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/synth"
)

// TestPicturesFromTheCLI publishes a small reference snapshot, records its
// manifest, and has restore and manifest show/inspect draw their
// pictures; restore also prints the startup-set line.
func TestPicturesFromTheCLI(t *testing.T) {
	dir, err := os.MkdirTemp("", "wsplot-")
	if err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(dir, "run")
	t.Cleanup(func() {
		for _, m := range mountPointsBelow(t, run) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
		os.RemoveAll(dir)
	})
	ref, err := synth.Generate(synth.Options{MemoryBytes: 16 << 20, Seed: 3, Dir: filepath.Join(dir, "ref")})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(ref.Layout)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "warmstart.toml")
	text := fmt.Sprintf("[backend.posix_fs]\nsnapshot_store = %q\n[runtime]\ndir = %q\n", filepath.Join(dir, "store"), run)
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun := func(args ...string) string {
		t.Helper()
		r := runCLI(t, append([]string{"--config", cfg}, args...)...)
		if r.code != 0 {
			t.Fatalf("warmstart %s: exit %d\n%s", strings.Join(args, " "), r.code, r.stderr)
		}
		return r.stdout
	}
	mustRun("snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory, "--alias", "pic",
		"--layout", strings.TrimSpace(string(spec)))
	mustRun("snapshot", "record-manifest", "pic", "--trace", ref.Trace)

	timeline := filepath.Join(dir, "timeline.png")
	out := mustRun("restore", "pic", "--prefetch", "on", "--trace", ref.Trace, "--plot", timeline)
	if !strings.Contains(out, "startup set ") || !strings.Contains(out, "% in time") {
		t.Errorf("restore printed no startup-set line:\n%s", out)
	}
	checkPNG(t, timeline)
	var rep struct {
		StartupSet struct {
			Pages  int64 `json:"startup_set_pages"`
			InTime int64 `json:"in_time_pages"`
			Late   int64 `json:"late_pages"`
			Unused int64 `json:"unused_pages"`
			Ran    bool  `json:"prefetch_ran"`
		} `json:"startup_set"`
	}
	if err := json.Unmarshal([]byte(mustRun("restore", "pic", "--prefetch", "on", "--trace", ref.Trace, "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if ss := rep.StartupSet; ss.Pages == 0 || ss.InTime+ss.Late+ss.Unused != ss.Pages || !ss.Ran {
		t.Errorf("restore --json startup_set = %+v", ss)
	}

	byAlias := filepath.Join(dir, "map.png")
	out = mustRun("manifest", "show", "pic", "--plot", byAlias)
	if !strings.Contains(out, "sha256") {
		t.Errorf("manifest show by alias printed:\n%s", out)
	}
	checkPNG(t, byAlias)
	manifestFile := strings.TrimSpace(strings.TrimPrefix(strings.Split(out, "\n")[0], "file"))
	bySVG := filepath.Join(dir, "map.svg")
	mustRun("manifest", "inspect", manifestFile, "--plot", bySVG)
	if data, err := os.ReadFile(bySVG); err != nil || !strings.Contains(string(data), "<svg") {
		t.Errorf("manifest inspect FILE --plot wrote no SVG (%v)", err)
	}
	if r := runCLI(t, "--config", cfg, "manifest", "show", "nobody"); r.code == 0 || !strings.Contains(r.stderr, "nobody") {
		t.Errorf("manifest show of an unknown alias: exit %d, %q", r.code, r.stderr)
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 300 {
		t.Errorf("%s is %v", path, b)
	}
}
