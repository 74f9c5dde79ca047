package chunkcache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
)

// CheckReport is what Check found of one object's cached blocks.
type CheckReport struct {
	// Blocks is how many cached blocks were checked, Bytes their bytes.
	Blocks int   `json:"blocks"`
	Bytes  int64 `json:"bytes"`
	// Evicted are the indexes of the blocks that failed a check and were
	// dropped (file removed): the next read fetches them again.
	Evicted []int64 `json:"evicted,omitempty"`
}

// Check reads every block of object the cache holds (in memory or on
// disk, this process's or another's) and checks it: against the CRC-32C
// of its file name, then with verify, the reader's own check (the
// memory's digest table), given the block's index and bytes. A block that
// fails either is dropped as Uncache drops it, so the next read fetches it
// again from the store. A block that cannot be read (an I/O error) is
// left as it is, and the error returned after the others were checked.
// It is `snapshot verify`'s look at the node cache, which a restore's
// reads otherwise check only as the guest touches them.
func (c *Cache) Check(ctx context.Context, object string, verify func(idx int64, data []byte) error) (CheckReport, error) {
	if err := c.begin(); err != nil {
		return CheckReport{}, err
	}
	defer c.ops.Done()
	var rep CheckReport
	var ioErrs []error
	for _, e := range c.entriesOf(object) {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		data, err := c.readBlock(e)
		if errors.Is(err, os.ErrNotExist) {
			c.forget(object, e.key.index, c.chunkPath(e)) // evicted meanwhile
			continue
		}
		if err == nil {
			rep.Blocks++
			rep.Bytes += int64(len(data))
			if err = verify(e.key.index, data); err != nil {
				err = fmt.Errorf("%w: %w", errCorrupt, err)
			}
		}
		switch {
		case errors.Is(err, errCorrupt):
			c.drop(object, e.key.index*c.blockBytes, e.length, false)
			rep.Evicted = append(rep.Evicted, e.key.index)
		case err != nil:
			ioErrs = append(ioErrs, fmt.Errorf("block %d of %s: %w", e.key.index, object, err))
		}
	}
	return rep, errors.Join(ioErrs...)
}

// entriesOf returns the cached entries of object, by index.
func (c *Cache) entriesOf(object string) []*entry {
	c.mu.Lock()
	var out []*entry
	for k, e := range c.entries {
		if k.object == object {
			out = append(out, e)
		}
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].key.index < out[j].key.index })
	return out
}

// readBlock is e's bytes: from memory, or from its file checked against
// its name.
func (c *Cache) readBlock(e *entry) ([]byte, error) {
	c.mu.Lock()
	data, onDisk := e.data, e.onDisk
	c.mu.Unlock()
	if !onDisk {
		return data, nil
	}
	data, err := loadVerified(c.chunkPath(e), e.length, e.crc)
	if errors.Is(err, errCorrupt) {
		c.stats.corrupt.Add(1)
	}
	return data, err
}
