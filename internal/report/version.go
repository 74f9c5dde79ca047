package report

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version renders the main module's version, the VCS revision the
// binary was built from (with its commit time, and whether the work tree
// had uncommitted changes) and the Go toolchain. A binary built with
// -buildvcs=false, or by go run or go test, carries no revision: it says so
// rather than print an empty one.
func Version(bi *debug.BuildInfo) string {
	version, goVersion := "(unknown)", runtime.Version()
	settings := map[string]string{}
	if bi != nil {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "warmstart %s\n", version)
	if rev := settings["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "revision %s", rev)
		if t := settings["vcs.time"]; t != "" {
			fmt.Fprintf(&b, ", committed %s", t)
		}
		if settings["vcs.modified"] == "true" {
			b.WriteString(", with uncommitted changes")
		}
		b.WriteString("\n")
	} else {
		b.WriteString("revision unknown (built without VCS information)\n")
	}
	fmt.Fprintf(&b, "%s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}
