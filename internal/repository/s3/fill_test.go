package s3

import (
	"testing"

	"warmstart/internal/repository/repotest"
)

// TestBackgroundFillAfterReady: once a restore of a snapshot is ready, the
// rest of its memory comes into the node cache by itself, unless the fill
// is turned off.
func TestBackgroundFillAfterReady(t *testing.T) {
	pub := chunkyRepo(t, "")
	rec, _ := repotest.PublishInputs(t, pub, chunkyInputs(t, 21), "")
	for _, disabled := range []bool{false, true} {
		o := testOptions(t, server.Endpoint)
		o.Prefix, o.ChunkBytes, o.BlockBytes = pub.keys.prefix, testChunkBytes, testChunkBytes
		o.Fill = FillOptions{Disabled: disabled, Concurrency: 2, BitsPerSec: 1 << 30}
		node := openWith(t, o)
		res, err := node.Resolve(bg(), rec.ID)
		if err != nil {
			t.Fatal(err)
		}
		res.Memory.(*memorySource).RestoreReady()
		node.WaitFill()
		cached := 0
		for idx := range int64(8) {
			if node.Cache().Cached(rec.MemorySHA256, idx) {
				cached++
			}
		}
		if want := map[bool]int{false: 8, true: 0}[disabled]; cached != want {
			t.Fatalf("fill disabled %v: %d of 8 blocks cached, want %d", disabled, cached, want)
		}
	}
}
