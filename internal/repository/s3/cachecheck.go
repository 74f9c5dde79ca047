package s3

import (
	"context"
	"fmt"

	"warmstart/internal/chunkcache"
	"warmstart/internal/repository"
)

// CheckCache checks every block of rec's memory this node's cache holds
// with check, given the block's offset in the memory file and its bytes
// (snapshot verify passes the snapshot's digest table), and evicts those
// that fail (chunkcache.Cache.Check). What a restore reads is checked as
// the guest touches it; this is the operator's look at the rest, and
// what a poisoned block that no restore touched yet is found by.
func (r *Repo) CheckCache(ctx context.Context, rec repository.Record, check func(off int64, data []byte) error) (chunkcache.CheckReport, error) {
	if err := r.openLocal(); err != nil {
		return chunkcache.CheckReport{}, fmt.Errorf("check the node cache: %w", err)
	}
	bs := r.cache.BlockBytes()
	rep, err := r.cache.Check(ctx, rec.MemorySHA256, func(idx int64, data []byte) error { return check(idx*bs, data) })
	if err != nil {
		return rep, fmt.Errorf("check the node cache of %s: %w", rec.ID, err)
	}
	return rep, nil
}
