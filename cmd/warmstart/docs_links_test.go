package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestDocsRelativeLinksResolve: every relative link of README.md and docs/
// names a file or directory of the repository, so that moving or renaming a
// page cannot leave a link behind that GitHub would show as a 404.
func TestDocsRelativeLinksResolve(t *testing.T) {
	for _, file := range docFiles(t) {
		for _, l := range links(docLines(t, file)) {
			target, _, _ := strings.Cut(l, "#")
			if target == "" || isExternalLink(target) {
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot, filepath.Dir(file), target)); err != nil {
				t.Errorf("%s links to %s, which is not in the repository", file, l)
			}
		}
	}
}

// isExternalLink reports whether a link target leaves the repository.
func isExternalLink(target string) bool {
	return strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:")
}

// docAnchorInCode is a page of docs/ and one of its anchors named in code or
// in the daemon's OpenAPI document ("docs/daemon.md#api-version").
var docAnchorInCode = regexp.MustCompile(`docs/([a-z0-9_-]+\.md)#([A-Za-z0-9_-]+)`)

// TestDocsAnchorsNamedInCodeExist: a comment, message or schema that sends
// the reader to a section of docs/ names a heading that is there.
func TestDocsAnchorsNamedInCodeExist(t *testing.T) {
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != repoRoot && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !(strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".json")) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range docAnchorInCode.FindAllStringSubmatch(string(b), -1) {
			page := "docs/" + m[1]
			if _, err := os.Stat(filepath.Join(repoRoot, page)); err != nil {
				t.Errorf("%s names %s, which is not in the repository", path, m[0])
				continue
			}
			if !slices.Contains(anchors(docLines(t, page)), m[2]) {
				t.Errorf("%s names %s, which has no such heading", path, m[0])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDocsAnchorsFollowGitHub: the anchors the link checks compare against
// are the ones GitHub renders: lower case, punctuation dropped, spaces made
// hyphens, and a heading that repeats an earlier one numbered from 1.
func TestDocsAnchorsFollowGitHub(t *testing.T) {
	lines := []string{
		"# Benchmark log",
		"## 2026-12-07: the speed goals, before and after",
		"### The last run (build `10c1f38`)",
		"### The QEMU guest",
		"### The QEMU guest",
		"### The QEMU guest",
		"not # a heading",
		"####no space, no heading",
	}
	want := []string{
		"benchmark-log",
		"2026-12-07-the-speed-goals-before-and-after",
		"the-last-run-build-10c1f38",
		"the-qemu-guest", "the-qemu-guest-1", "the-qemu-guest-2",
	}
	if got := anchors(lines); !slices.Equal(got, want) {
		t.Errorf("anchors:\n got %q\nwant %q", got, want)
	}
}

// numberRepeats gives a repeated anchor GitHub's suffix: the second
// "x" is "x-1", the third "x-2".
func numberRepeats(as []string) []string {
	seen := map[string]int{}
	out := make([]string, 0, len(as))
	for _, a := range as {
		if n := seen[a]; n > 0 {
			out = append(out, a+"-"+strconv.Itoa(n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}
