package s3

import (
	"path/filepath"
	"testing"

	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
)

// TestCRCPreservingCachePatchIsFetchedAgain: a writer of the node's
// cache dir patches every page of every cached block and keeps each
// page's CRC-32C, and with it the CRC in the block's file name, with a
// 4-byte fix-up. The restore reads the published bytes all the same: the
// device checks every page against the snapshot's SHA-256 table, drops
// the block and fetches it again from the store.
func TestCRCPreservingCachePatchIsFetchedAgain(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	snap, o := w.restoredOnce(t, 7)
	files, err := filepath.Glob(filepath.Join(o.CacheDir, "chunks", "*", "*.blk"))
	if err != nil || len(files) == 0 {
		t.Fatalf("cached block files %v (%v)", files, err)
	}
	for _, f := range files {
		_, _, length, _, ok := blockFileName(filepath.Base(f))
		if !ok {
			t.Fatalf("unexpected cache file %s", f)
		}
		for off := int64(0); off+4096 <= length; off += 4096 {
			repotest.PatchKeepingCRC(t, f, off)
		}
	}
	second := openWith(t, o) // the same cache directory, reopened
	before := second.RequestStats()
	inst := w.restoreOK(t, second, snap, restore.ModeOff)
	if err := inst.Stop(bg()); err != nil {
		t.Fatal(err)
	}
	if gets := second.RequestStats().Sub(before).Gets; gets == 0 {
		t.Fatal("the patched blocks were not fetched again")
	}
}
