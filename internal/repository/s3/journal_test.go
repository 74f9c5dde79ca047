package s3

import "testing"

// TestJournalWrites counts the journal writes of a publish of n chunks:
// about log2(n/journalFirstStep)+1 up to journalMaxStep chunks, one per
// journalMaxStep after, the last naming every chunk, and no write naming
// more than journalMaxStep chunks beyond the one before.
func TestJournalWrites(t *testing.T) {
	for _, c := range []struct{ chunks, writes int }{
		{1, 1}, {16, 1}, {17, 2}, {100, 4}, {512, 6}, {513, 7}, {16384, 37},
	} {
		j := &chunkJournal{}
		writes := 0
		for hashed := 1; hashed <= c.chunks; hashed++ {
			if !j.due(hashed, c.chunks) {
				continue
			}
			if hashed-j.covered > journalMaxStep {
				t.Fatalf("%d chunks: a write names chunks %d..%d, more than %d", c.chunks, j.covered, hashed, journalMaxStep)
			}
			writes++
			j.covered = hashed
		}
		if writes != c.writes || j.covered != c.chunks {
			t.Errorf("%d chunks: %d writes naming %d chunks, want %d naming all", c.chunks, writes, j.covered, c.writes)
		}
	}
}
