package s3

import (
	"log/slog"
	"strings"
	"testing"

	"warmstart/internal/logtest"
)

// TestNodeCacheWarningsReachTheLog: the node cache's warnings reach
// Options.Log; here a bound smaller than a snapshot being read, which
// makes every later read fetch again.
func TestNodeCacheWarningsReachTheLog(t *testing.T) {
	pub, rec := chunkyPublisher(t, 23)
	var logs logtest.Buffer
	o := chunkyOptions(t, server.Endpoint, pub.keys.prefix)
	o.CacheMaxBytes, o.Fill = 2*testChunkBytes, FillOptions{Disabled: true}
	o.Log = slog.New(slog.NewTextHandler(&logs, nil))
	rd := openMemory(t, openWith(t, o), rec.ID)
	buf := make([]byte, 4096)
	for off := int64(0); off < rd.Size(); off += testChunkBytes {
		if _, err := rd.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "not kept") {
		t.Fatalf("log of a node cache smaller than the memory read: %q", out)
	}
}
