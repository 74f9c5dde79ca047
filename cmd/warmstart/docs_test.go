package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"

	"warmstart/internal/config"
)

// The documentation's shape: the README is a front door that a newcomer
// reads to the verb table without scrolling far, and everything else lives
// in docs/, by topic.
const (
	readmeMaxLines       = 200
	verbTableMaxLastLine = 120
	proseMaxRunes        = 100
)

// repoRoot is the repository, seen from this package's directory (where go
// test runs it).
const repoRoot = "../.."

// glossaryTerms are the terms the README and docs/ rely on without
// explaining them where they are used: each must be a heading of
// docs/glossary.md, defined there once.
var glossaryTerms = []string{
	"admission", "agent", "alias", "alias mismatch", "artifact",
	"background fill", "block", "capture", "capture lease", "catalog",
	"chain", "chunk", "chunk map", "claim", "dependent", "depth", "device generation", "digest table",
	"drift", "e2b policy", "[envd]", "Experiment 2", "fault-around",
	"File backend", "file device", "file-cold", "file-warm",
	"first-touch order", "following the guest", "hot control", "in time",
	"flatten", "late", "unused", "missed", "io_engine", "layer", "learned", "learner",
	"memory device", "memory lower file", "node", "node cache", "page map",
	"prefetch policy", "prefetch task", "quarantine", "readaround", "ready",
	"reap policy", "record", "recording", "reference snapshot",
	"refined manifest", "refined pack", "replay VMM", "repository",
	"runtime directory", "seed policy", "small gaps", "startup manifest",
	"startup pack", "startup set", "startup trace", "TCG", "the seed",
	"tombstone", "trial", "Uffd backend", "uffd device", "uffd", "variant",
	"VMM", "warmstart policy",
}

func TestDocsREADMEIsAFrontDoor(t *testing.T) {
	lines := docLines(t, "README.md")
	if len(lines) > readmeMaxLines {
		t.Errorf("README.md has %d lines; at most %d: move the rest into docs/", len(lines), readmeMaxLines)
	}
	_, last := verbTable(t, lines)
	if last > verbTableMaxLastLine {
		t.Errorf("README.md's verb table ends on line %d; it must end by line %d", last, verbTableMaxLastLine)
	}
}

func TestDocsREADMEVerbTableNamesEveryVerb(t *testing.T) {
	rows, _ := verbTable(t, docLines(t, "README.md"))
	verbs := leafVerbs(rootCmd)
	for _, v := range verbs {
		if n := count(rows, v); n != 1 {
			t.Errorf("verb %q is in README.md's verb table %d times; want one row", v, n)
		}
	}
	for _, r := range rows {
		if !slices.Contains(verbs, r) && !cobraBuiltin(r) {
			t.Errorf("README.md's verb table names %q, which is no verb of warmstart", r)
		}
	}
}

func TestDocsGlossaryDefinesEveryTermOnce(t *testing.T) {
	defined := map[string]int{}
	for _, h := range headings(docLines(t, "docs/glossary.md"), "### ") {
		for _, name := range strings.Split(strings.ReplaceAll(h, "`", ""), ", ") {
			defined[strings.ToLower(name)]++
		}
	}
	for name, n := range defined {
		if n > 1 {
			t.Errorf("docs/glossary.md defines %q %d times", name, n)
		}
	}
	for _, term := range glossaryTerms {
		if defined[strings.ToLower(term)] == 0 {
			t.Errorf("docs/glossary.md does not define %q (a heading \"### %s\")", term, term)
		}
	}
}

func TestDocsLinksLandOnAHeading(t *testing.T) {
	for _, file := range docFiles(t) {
		for _, l := range links(docLines(t, file)) {
			target, anchor, ok := strings.Cut(l, "#")
			if !ok || strings.Contains(target, "://") {
				continue
			}
			page := file
			if target != "" {
				page = filepath.ToSlash(filepath.Join(filepath.Dir(file), target))
			}
			if _, err := os.Stat(filepath.Join(repoRoot, page)); err != nil {
				continue // a page written elsewhere, or no page: not an anchor's business
			}
			if !slices.Contains(anchors(docLines(t, page)), anchor) {
				t.Errorf("%s links to %s#%s, which has no such heading", file, page, anchor)
			}
		}
	}
}

func TestDocsConfigurationListsEveryKey(t *testing.T) {
	var defaults map[string]any
	if _, err := toml.Decode(config.DefaultTOML(), &defaults); err != nil {
		t.Fatalf("decode the default configuration: %v", err)
	}
	keys := flatten("", defaults)
	documented := firstCells(docLines(t, "docs/configuration.md"))
	for _, k := range keys {
		if !slices.Contains(documented, k) {
			t.Errorf("docs/configuration.md has no row for key %s (see warmstart config defaults)", k)
		}
	}
	for _, d := range documented {
		if strings.Contains(d, ".") && !slices.Contains(keys, d) {
			t.Errorf("docs/configuration.md documents %s, which is no configuration key", d)
		}
	}
}

func TestDocsProseLinesAreShort(t *testing.T) {
	for _, file := range docFiles(t) {
		for i, line := range docLines(t, file) {
			if isProse(line) && len([]rune(line)) > proseMaxRunes {
				t.Errorf("%s:%d has %d characters; prose lines are at most %d",
					file, i+1, len([]rune(line)), proseMaxRunes)
			}
		}
	}
}

// docLines returns a file of the repository as lines, with the lines of
// fenced code blocks blanked out except for their fences (so headings,
// tables and links are only ever read from prose).
func docLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	inFence := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			lines[i] = ""
		}
	}
	return lines
}

// docFiles lists README.md and every markdown page under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, p := range pages {
		files = append(files, "docs/"+filepath.Base(p))
	}
	return files
}

// verbTable returns the first cells of the README's table headed "| verb |"
// (backticks removed) and the 1-based number of its last line.
func verbTable(t *testing.T, lines []string) (verbs []string, last int) {
	t.Helper()
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "| verb |") })
	if start < 0 {
		t.Fatal(`README.md has no verb table (a table whose header starts "| verb |")`)
	}
	last = start
	for last+1 < len(lines) && strings.HasPrefix(lines[last+1], "|") {
		last++
	}
	return firstCells(lines[start : last+1]), last + 1
}

// firstCells returns the first cell of every table body row in lines,
// backticks removed.
func firstCells(lines []string) []string {
	var cells []string
	for i, l := range lines {
		if !strings.HasPrefix(l, "|") || i+1 < len(lines) && strings.HasPrefix(lines[i+1], "|---") {
			continue // not a row, or a header
		}
		cell, _, _ := strings.Cut(strings.TrimPrefix(l, "|"), "|")
		if cell = strings.TrimSpace(strings.ReplaceAll(cell, "`", "")); !strings.HasPrefix(cell, "---") {
			cells = append(cells, cell)
		}
	}
	return cells
}

// leafVerbs lists every verb an operator can run ("snapshot import"), hidden
// roles and cobra's own help and completion left out.
func leafVerbs(c *cobra.Command) []string {
	var verbs []string
	for _, sub := range c.Commands() {
		switch {
		case sub.Hidden || cobraBuiltin(sub.Name()):
		case sub.HasSubCommands():
			verbs = append(verbs, leafVerbs(sub)...)
		default:
			verbs = append(verbs, strings.TrimPrefix(sub.CommandPath(), rootCmd.Name()+" "))
		}
	}
	sort.Strings(verbs)
	return verbs
}

func cobraBuiltin(name string) bool { return name == "help" || name == "completion" }

func count(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// headings returns the text of every heading of one level ("### ").
func headings(lines []string, level string) []string {
	var hs []string
	for _, l := range lines {
		if strings.HasPrefix(l, level) {
			hs = append(hs, strings.TrimSpace(strings.TrimPrefix(l, level)))
		}
	}
	return hs
}

// anchors returns the anchor GitHub gives each heading of a page, a
// repeated heading's numbered as GitHub numbers it.
func anchors(lines []string) []string {
	var as []string
	for _, l := range lines {
		if level := strings.IndexFunc(l, func(r rune) bool { return r != '#' }); level > 0 && strings.HasPrefix(l[level:], " ") {
			as = append(as, slug(l[level+1:]))
		}
	}
	return numberRepeats(as)
}

// slug is GitHub's heading anchor: lower case, punctuation other than '-'
// and '_' dropped, spaces made hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var linkPattern = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// links returns the target of every markdown link in lines.
func links(lines []string) []string {
	var ls []string
	for _, l := range lines {
		for _, m := range linkPattern.FindAllStringSubmatch(l, -1) {
			ls = append(ls, m[1])
		}
	}
	return ls
}

// isProse reports whether a line is running text: not a table row, and not
// one unbreakable word such as a long address.
func isProse(line string) bool {
	return !strings.HasPrefix(line, "|") && strings.Contains(strings.TrimSpace(line), " ")
}

// flatten lists the dotted keys of a decoded TOML table ("memory.device").
func flatten(prefix string, table map[string]any) []string {
	var keys []string
	for k, v := range table {
		if sub, ok := v.(map[string]any); ok {
			keys = append(keys, flatten(prefix+k+".", sub)...)
			continue
		}
		keys = append(keys, prefix+k)
	}
	sort.Strings(keys)
	return keys
}
