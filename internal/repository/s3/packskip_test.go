package s3

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/logtest"
	"warmstart/internal/restore"
)

// logLines is a JSON log sink safe for concurrent writers.
type logLines struct{ logtest.Buffer }

// warnings are the warning lines logged with msg.
func (l *logLines) warnings(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var found []map[string]any
	for line := range strings.Lines(l.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["level"] == "WARN" && m["msg"] == msg {
			found = append(found, m)
		}
	}
	return found
}

// A restore that goes without its startup pack (the pack object damaged,
// or its index gone) still reads the right bytes, from the chunks, and
// says so: one warning naming the snapshot and the reason, and the reason
// in its prefetch report. A restore with a sound pack says nothing.
func TestSkippedStartupPackIsReported(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	publisher := w.repo(t, 0)
	damaged, indexless := w.publish(t, publisher, 21), w.publish(t, publisher, 22)
	log := &logLines{}
	w.restorer.Log = slog.New(slog.NewJSONHandler(log, nil))

	sound := w.restoreOK(t, w.repo(t, 0), indexless, restore.ModeOn)
	if sound.Prefetch.StartupPackSkipped != "" || len(log.warnings(t, "startup pack skipped")) != 0 {
		t.Fatalf("a sound pack reported skipped: %q", sound.Prefetch.StartupPackSkipped)
	}
	if err := sound.Stop(bg()); err != nil {
		t.Fatal(err)
	}

	packKey, _ := startupPackKeys(t, publisher, damaged.id)
	rewriteObject(t, publisher, packKey, func(data []byte) []byte {
		for i := range data {
			data[i] ^= 0x5a
		}
		return data
	})
	checkPackSkipped(t, w, log, damaged, "integrity")

	_, indexKey := startupPackKeys(t, publisher, indexless.id)
	if err := publisher.core.RemoveObject(bg(), publisher.bucket, indexKey, minio.RemoveObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	checkPackSkipped(t, w, log, indexless, "")
}

// startupPackKeys are the keys of the pack object and index of id.
func startupPackKeys(t *testing.T, r *Repo, id string) (obj, index string) {
	t.Helper()
	rec, err := r.Get(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.StartupPack == nil {
		t.Fatalf("snapshot %s has no startup pack", id)
	}
	return packKeys(r.keys, id, rec.StartupPack.ManifestSHA256)
}

// checkPackSkipped restores snap on a cold node with prefetch and wants
// the right bytes, one new warning naming snap and a reason (containing
// want), and that reason in the prefetch report.
func checkPackSkipped(t *testing.T, w *world, log *logLines, snap snapshot, want string) {
	t.Helper()
	before := len(log.warnings(t, "startup pack skipped"))
	inst := w.restoreOK(t, w.repo(t, 0), snap, restore.ModeOn)
	if err := inst.Stop(bg()); err != nil {
		t.Fatal(err)
	}
	reason := inst.Prefetch.StartupPackSkipped
	t.Logf("snapshot %s: startup pack skipped: %s", snap.id, reason)
	if reason == "" || !strings.Contains(reason, want) {
		t.Errorf("snapshot %s: prefetch report's startup_pack_skipped = %q, want a reason containing %q", snap.id, reason, want)
	}
	lines := log.warnings(t, "startup pack skipped")[before:]
	if len(lines) != 1 || lines[0]["snapshot"] != snap.id || lines[0]["err"] != reason {
		t.Errorf("snapshot %s: warnings %v; want one naming the snapshot and the reason %q", snap.id, lines, reason)
	}
}
