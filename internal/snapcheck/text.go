package snapcheck

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// WriteText writes the report for people: a headline, then one line per
// artifact and, under it, each of its problems; the bad blocks of the
// memory file are listed as ranges of consecutive blocks.
func WriteText(w io.Writer, r Report) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "snapshot %s: %s\n", name(r), headline(r))
	for _, p := range r.Problems {
		fmt.Fprintf(bw, "  %s: %s\n", p.Kind, p.Message)
	}
	cols := columnsOf(r)
	for _, a := range r.Artifacts {
		writeArtifact(bw, a, cols)
	}
	if c := r.Cache; c != nil {
		fmt.Fprintf(bw, "  %-*s %-*s %d blocks (%d bytes) checked, %d evicted\n", cols.name, cacheLine, cols.status, cacheStatus(*c), c.Blocks, c.Bytes, len(c.Evicted))
	}
	return bw.Flush()
}

// cacheLine names the node cache's line among the artifacts'.
const cacheLine = "node cache"

// columns are the widths of the name and status columns of a report's
// artifact lines: at least the usual names' and statuses', wider when a
// name is longer (a layer's "<owner id>/<file>"), so every line's status
// and summary start in one column.
type columns struct{ name, status int }

func columnsOf(r Report) columns {
	c := columns{name: 21, status: len(StatusNotChecked)}
	for _, a := range r.Artifacts {
		c.name, c.status = max(c.name, len(a.Name)), max(c.status, len(a.Status))
	}
	return c
}

func cacheStatus(c CacheReport) string {
	if len(c.Evicted) > 0 {
		return StatusBad
	}
	return StatusOK
}

func name(r Report) string {
	switch {
	case r.ID != "" && r.Alias != "":
		return fmt.Sprintf("%s (alias %s)", r.ID, r.Alias)
	case r.ID != "":
		return r.ID
	}
	return "alias " + r.Alias
}

func headline(r Report) string {
	switch {
	case !r.OK:
		return "PROBLEMS FOUND"
	case r.Unverified:
		return "ok, unverified (no digest table)"
	case r.DigestsAdded != nil:
		return "ok, digest table added"
	}
	return "ok"
}

func writeArtifact(w io.Writer, a Artifact, cols columns) {
	fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("  %-*s %-*s %s", cols.name, a.Name, cols.status, a.Status, summary(a)), " "))
	for _, p := range a.Problems {
		fmt.Fprintf(w, "      %s: %s\n", p.Kind, p.Message)
		if p.Kind == KindBadBlocks && a.Blocks != nil {
			writeRanges(w, a.Blocks.BadRanges)
		}
	}
	if a.Note != "" {
		fmt.Fprintf(w, "      %s\n", a.Note)
	}
}

// summary describes what was read of an artifact.
func summary(a Artifact) string {
	if a.ReadBytes == 0 && a.ReadSHA256 == "" {
		return ""
	}
	verb := "read"
	if a.Status == StatusAdded {
		verb = "written"
	}
	s := fmt.Sprintf("%d bytes %s", a.ReadBytes, verb)
	if a.ReadSHA256 != "" {
		s += ", sha256 " + a.ReadSHA256
	}
	if b := a.Blocks; b != nil {
		s += fmt.Sprintf(", %d blocks checked, %d bad", b.Checked, b.Bad)
	}
	return s
}

func writeRanges(w io.Writer, ranges []Range) {
	for _, r := range ranges {
		unit := "blocks"
		if r.Blocks == 1 {
			unit = "block"
		}
		fmt.Fprintf(w, "        offset %d (0x%x), %d bytes (%d %s)\n", r.Offset, r.Offset, r.Length, r.Blocks, unit)
	}
}
