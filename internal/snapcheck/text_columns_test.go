package snapcheck

import (
	"bytes"
	"strings"
	"testing"
)

// TestWriteTextAlignsLongNames: a layered snapshot's artifacts are named
// "<owner id>/<file>", longer than the other names; every artifact line
// (and the node cache's) still starts its status and its summary in one
// column each.
func TestWriteTextAlignsLongNames(t *testing.T) {
	long := "0123456789abcdef0123456789abcdef/layer-0123456789abcdef.sha256-digests"
	r := Report{ID: "snap", OK: false, Cache: &CacheReport{BlockBytes: 4096}, Artifacts: []Artifact{
		{Name: "vm_state.bin", Status: StatusOK, ReadBytes: 10},
		{Name: long, Status: StatusNotChecked, ReadBytes: 20},
		{Name: "memory.bin", Status: StatusBad, ReadBytes: 30,
			Problems: []Problem{{Kind: KindBadBlocks, Message: "1 bad block"}}},
	}}
	var b bytes.Buffer
	if err := WriteText(&b, r); err != nil {
		t.Fatal(err)
	}
	var statusCol, summaryCol []int
	for _, line := range strings.Split(b.String(), "\n") {
		fields := strings.Fields(line)
		if !strings.HasPrefix(line, "  ") || strings.HasPrefix(line, "    ") || len(fields) < 3 {
			continue
		}
		status := fields[1]
		if strings.HasPrefix(line, "  node cache") {
			status = fields[2]
		}
		at := strings.Index(line, " "+status+" ") + 1
		statusCol = append(statusCol, at)
		summaryCol = append(summaryCol, at+len(status)+strings.IndexFunc(line[at+len(status):], func(r rune) bool { return r != ' ' }))
	}
	if len(statusCol) != 4 {
		t.Fatalf("found %d artifact lines, want 4:\n%s", len(statusCol), b.String())
	}
	for i := range statusCol {
		if statusCol[i] != statusCol[0] || summaryCol[i] != summaryCol[0] {
			t.Fatalf("columns not aligned (status at %v, summary at %v):\n%s", statusCol, summaryCol, b.String())
		}
	}
}
