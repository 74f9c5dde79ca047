package s3

import (
	"context"
	"fmt"

	"warmstart/internal/chunkmap"
	"warmstart/internal/repository"
)

// The journal of a publish, artifacts/<id>/memory.journal, is a digest
// list (chunkmap.EncodeList) of the chunks the publish relies on: a chunk
// is named there before the publish looks for it in the bucket or uploads
// it. Garbage collection keeps every chunk a journal names, as it keeps
// those a chunk map names, for as long as the journal is there: while its
// publish lives, and until the sweep reclaims a dead one (leftovers.go),
// which first copies the journal to gc/abandoned/<id>.chunks. Chunks such
// a list names that nothing else keeps are then removed by the next
// collection, minutes after their publisher died rather than the chunk
// grace after they were written. The journal is removed once the record
// is written: the chunk map, stored before the record, names the same
// chunks. (One left behind names what the map names, and goes with the
// snapshot's other artifacts.)
//
// S3 has no append, so each write replaces the journal with the list of
// every chunk hashed so far. A publish (uploadChunked) reads and hashes
// the memory file ahead of the workers that look for and upload chunks
// (they read again the chunks they upload), and writes the journal after
// the first journalFirstStep chunks, then whenever the chunks hashed
// since the last write are as many as those it named (doubling), at most
// journalMaxStep: a publish of n chunks writes it about
// log2(n/journalFirstStep)+1 times up to journalMaxStep chunks and once
// per journalMaxStep after, and removes it once. Workers wait for a write
// only at the very start: hashing runs far ahead of uploads, and the
// chunks a write names reach the workers through a queue of
// 2*journalMaxStep.

const (
	// journalFirstStep is the chunks the first journal write names.
	journalFirstStep = 2 * publishWorkers
	// journalMaxStep bounds the chunks hashed between two writes, and so
	// how far (twice that) the feeder reads ahead of the workers: those
	// chunks are still in the page cache when a worker reads them again.
	journalMaxStep = 512
)

// chunkJournal is the journal of one publish in progress.
type chunkJournal struct {
	r  *Repo
	id string
	// digests are those of the chunks hashed so far, each once.
	digests []chunkmap.Digest
	seen    map[chunkmap.Digest]bool
	// covered is how many chunks of the file (in order) the last write
	// named.
	covered int
}

func (r *Repo) newJournal(id string) *chunkJournal {
	return &chunkJournal{r: r, id: id, seen: map[chunkmap.Digest]bool{}}
}

// add notes chunk c, just hashed.
func (j *chunkJournal) add(c chunkmap.Chunk) {
	if !c.Zero && !j.seen[c.Digest] {
		j.seen[c.Digest] = true
		j.digests = append(j.digests, c.Digest)
	}
}

// follow writes the journal as the hashers describe the chunks of m,
// whose indices arrive on hashed in any order: it adds them in file
// order, writes when due, and passes the indices each write named on to
// ready, for the workers. It returns the error of a failed write.
func (j *chunkJournal) follow(ctx context.Context, m chunkmap.Map, hashed <-chan int, ready chan<- int) error {
	done := make([]bool, len(m.Chunks))
	next := 0 // chunks described, in file order
	for i := range hashed {
		done[i] = true
		for next < len(done) && done[next] {
			j.add(m.Chunks[next])
			next++
		}
		if next == j.covered || !j.due(next, len(done)) {
			continue
		}
		from := j.covered
		if err := j.write(ctx, next); err != nil {
			return err
		}
		for k := from; k < next; k++ {
			select {
			case ready <- k:
			case <-ctx.Done():
				return nil // the cause is the caller's to report
			}
		}
	}
	return nil
}

// due reports whether the journal must be written now that hashed of the
// file's total chunks are hashed.
func (j *chunkJournal) due(hashed, total int) bool {
	return hashed == total || hashed-j.covered >= journalStep(j.covered)
}

// journalStep is how many chunks are hashed after a journal write that
// named covered chunks before the next write.
func journalStep(covered int) int {
	return min(max(covered, journalFirstStep), journalMaxStep)
}

// write stores the journal naming every chunk added so far, the first
// hashed of the file. A publish whose lease was revoked (a collector took
// it for dead) stops here rather than write on.
func (j *chunkJournal) write(ctx context.Context, hashed int) error {
	if j.r.leaseLost(j.id) {
		return fmt.Errorf("%w: the lease on %s was revoked, taken over or removed", repository.ErrLeaseEnded, j.id)
	}
	key := j.r.keys.artifact(j.id, journalName)
	if _, err := j.r.putSmall(ctx, key, chunkmap.EncodeList(j.digests), putCondition{}); err != nil {
		return fmt.Errorf("write the chunk journal: %w", err)
	}
	j.covered = hashed
	return nil
}
