package s3

import (
	"path/filepath"
	"testing"
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
	patchBlocksKeepingCRC(t, filepath.Join(o.CacheDir, "chunks", "*", "*.blk"), "cached block files")
	_, gets := w.restoreOnReopenedCache(t, snap, o)
	if gets == 0 {
		t.Fatal("the patched blocks were not fetched again")
	}
}
