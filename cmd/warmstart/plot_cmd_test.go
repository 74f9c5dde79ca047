package main

import (
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPicturesFromTheCLI publishes a small reference snapshot, records its
// manifest, and has restore and manifest show/inspect draw their
// pictures; restore also prints the startup-set line.
func TestPicturesFromTheCLI(t *testing.T) {
	root := newCLIRoot(t, "wsplot-", 3)
	ref := root.ref
	root.mustRun(t, "snapshot", "import", "--vm-state", ref.VMState, "--memory", ref.Memory, "--alias", "pic",
		"--layout", root.layout)
	root.mustRun(t, "snapshot", "record-manifest", "pic", "--trace", ref.Trace)
	checkRestorePictures(t, root)
	checkManifestPictures(t, root)
	if r := runCLI(t, "--config", root.cfg, "manifest", "show", "nobody"); r.code == 0 || !strings.Contains(r.stderr, "nobody") {
		t.Errorf("manifest show of an unknown alias: exit %d, %q", r.code, r.stderr)
	}
}

// mustRun runs the CLI with root's configuration and args as a child
// process, fails the test unless it exits 0, and returns its stdout.
func (root cliRoot) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	r := runCLI(t, append([]string{"--config", root.cfg}, args...)...)
	if r.code != 0 {
		t.Fatalf("warmstart %s: exit %d\n%s", strings.Join(args, " "), r.code, r.stderr)
	}
	// Every --plot says where it wrote the picture.
	for i, a := range args {
		if a == "--plot" && i+1 < len(args) && !strings.Contains(r.stderr, "wrote "+args[i+1]+"\n") {
			t.Errorf("warmstart %s did not say \"wrote %s\"; stderr:\n%s", strings.Join(args, " "), args[i+1], r.stderr)
		}
	}
	return r.stdout
}

// checkRestorePictures: restore --plot draws the timeline and prints the
// startup-set line; restore --json carries a startup set that adds up.
func checkRestorePictures(t *testing.T, root cliRoot) {
	t.Helper()
	timeline := filepath.Join(root.dir, "timeline.png")
	out := root.mustRun(t, "restore", "pic", "--prefetch", "on", "--trace", root.ref.Trace, "--plot", timeline)
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
	if err := json.Unmarshal([]byte(root.mustRun(t, "restore", "pic", "--prefetch", "on", "--trace", root.ref.Trace, "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	if ss := rep.StartupSet; ss.Pages == 0 || ss.InTime+ss.Late+ss.Unused != ss.Pages || !ss.Ran {
		t.Errorf("restore --json startup_set = %+v", ss)
	}
}

// checkManifestPictures: manifest show by alias draws a PNG, and manifest
// inspect of the file it names draws an SVG.
func checkManifestPictures(t *testing.T, root cliRoot) {
	t.Helper()
	byAlias := filepath.Join(root.dir, "map.png")
	out := root.mustRun(t, "manifest", "show", "pic", "--plot", byAlias)
	if !strings.Contains(out, "sha256") {
		t.Errorf("manifest show by alias printed:\n%s", out)
	}
	checkPNG(t, byAlias)
	manifestFile := strings.TrimSpace(strings.TrimPrefix(strings.Split(out, "\n")[0], "file"))
	bySVG := filepath.Join(root.dir, "map.svg")
	root.mustRun(t, "manifest", "inspect", manifestFile, "--plot", bySVG)
	if data, err := os.ReadFile(bySVG); err != nil || !strings.Contains(string(data), "<svg") {
		t.Errorf("manifest inspect FILE --plot wrote no SVG (%v)", err)
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
