package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"warmstart/internal/report"
)

// TestVersion: "version" and "--version" print the same description of the
// build, Go version included, and exit 0; "version" takes no argument.
func TestVersion(t *testing.T) {
	verb, flag := runCLI(t, "version"), runCLI(t, "--version")
	if verb.code != 0 || flag.code != 0 {
		t.Fatalf("exit %d and %d; stderr %q, %q", verb.code, flag.code, verb.stderr, flag.stderr)
	}
	if verb.stdout != flag.stdout {
		t.Errorf("version printed %q, --version %q", verb.stdout, flag.stdout)
	}
	bi, _ := debug.ReadBuildInfo()
	if verb.stdout != report.Version(bi) || !strings.HasPrefix(verb.stdout, "warmstart ") || !strings.Contains(verb.stdout, runtime.Version()) {
		t.Errorf("version printed %q, want this binary's build (%q)", verb.stdout, report.Version(bi))
	}
	if r := runCLI(t, "version", "extra"); r.code != 2 {
		t.Errorf("version extra: exit %d, want 2", r.code)
	}
}

func TestFormatVersion(t *testing.T) {
	stamped := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "warmstart", Version: "v0.0.0-20260102030405-0123456789ab+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	want := "warmstart v0.0.0-20260102030405-0123456789ab+dirty\n" +
		"revision 0123456789abcdef0123456789abcdef01234567, committed 2026-01-02T03:04:05Z, with uncommitted changes\n" +
		"go1.26.8 " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	if got := report.Version(stamped); got != want {
		t.Errorf("stamped build:\n%s\nwant\n%s", got, want)
	}

	unstamped := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "warmstart", Version: "(devel)"}}
	want = "warmstart (devel)\nrevision unknown (built without VCS information)\ngo1.26.8 " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	if got := report.Version(unstamped); got != want {
		t.Errorf("build without VCS information:\n%s\nwant\n%s", got, want)
	}
	if got := report.Version(nil); !strings.HasPrefix(got, "warmstart (unknown)\n") || !strings.Contains(got, runtime.Version()) {
		t.Errorf("no build information: %q", got)
	}
}
