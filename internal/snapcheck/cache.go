package snapcheck

import (
	"context"
	"fmt"

	"warmstart/internal/chunkcache"
	"warmstart/internal/repository"
)

// cacheChecker is a repository whose node keeps a cache of memory blocks
// that it can check (s3.Repo).
type cacheChecker interface {
	CheckCache(ctx context.Context, rec repository.Record, check func(off int64, data []byte) error) (chunkcache.CheckReport, error)
}

// CacheReport is what Options.Cache found in the node's cache.
type CacheReport struct {
	chunkcache.CheckReport
	// BlockBytes is the cache's block size; Evicted are block indexes.
	BlockBytes int64 `json:"block_bytes"`
}

// checkCache checks what repo's node cache holds of the snapshot's memory
// against the digest table blocks were judged by: a block the cache's own
// CRC passes may still not be the published bytes (a writer of the cache
// dir can keep a CRC), and this node's restores would read it instead of
// the store's. Bad blocks are evicted and reported as a problem.
func (c *checker) checkCache(repo repository.Repository) error {
	cc, ok := findIn[cacheChecker](repo)
	if !ok {
		return nil // no node cache: nothing but the store to read
	}
	if c.judge == nil {
		c.r.Problems = append(c.r.Problems, Problem{Kind: KindCache,
			Message: "the node cache was not checked: the snapshot has no digest table that can be used"})
		return nil
	}
	rep, err := cc.CheckCache(c.ctx, c.res.Record, func(off int64, data []byte) error { return c.judge.Verify(data, off) })
	if err != nil && c.ctx.Err() != nil {
		return c.ctx.Err()
	}
	c.r.Cache = &CacheReport{CheckReport: rep, BlockBytes: blockBytesOf(repo)}
	if err != nil {
		c.r.Problems = append(c.r.Problems, Problem{Kind: KindCache, Message: err.Error()})
	}
	if n := len(rep.Evicted); n > 0 {
		c.r.Problems = append(c.r.Problems, Problem{Kind: KindCache, Message: fmt.Sprintf(
			"%d of %d blocks this node cached do not match the digest table and were evicted (the next read fetches them from the store): blocks %v",
			n, rep.Blocks, rep.Evicted)})
	}
	return nil
}

// blockBytesOf is the block size of repo's node cache, 0 when unknown.
func blockBytesOf(repo repository.Repository) int64 {
	if cr, ok := findIn[interface{ Cache() *chunkcache.Cache }](repo); ok && cr.Cache() != nil {
		return cr.Cache().BlockBytes()
	}
	return 0
}
