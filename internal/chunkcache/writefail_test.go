package chunkcache

import (
	"log/slog"
	"os"
	"strings"
	"testing"

	"warmstart/internal/logtest"
)

// TestFailedBlockWritesAreLoggedOnce: a cache whose disk refuses every
// block (full, read-only, its directory replaced by a file) still serves
// the fetched bytes, and tells the operator once per minute, with how many
// blocks failed, rather than once per block: a cold restore of a large
// guest on a full disk otherwise writes a warning for every MiB it reads.
func TestFailedBlockWritesAreLoggedOnce(t *testing.T) {
	const blocks = 8
	var logs logtest.Buffer
	o := newOrigin(t, blocks*testBlock)
	c, err := Open(Options{Dir: t.TempDir(), MaxBytes: 64 << 20, BlockBytes: testBlock,
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// The object's directory cannot be made: every block write fails.
	if err := os.MkdirAll(c.chunksDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.objectDir("obj"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := openReader(t, c, o.object("obj"))
	for i := range int64(blocks) {
		readCheck(t, r, o, i*testBlock, 10)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	var writes []string
	for _, l := range logs.Take() {
		if strings.Contains(l, "write block") {
			writes = append(writes, l)
		}
	}
	if len(writes) != 1 || !strings.Contains(writes[0], "level=WARN") {
		t.Fatalf("logs of %d failed block writes: %q, want one WARN", blocks, writes)
	}
}
