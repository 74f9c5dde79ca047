package snapcheck

import (
	"context"
	"fmt"

	"warmstart/internal/chunkcache"
	"warmstart/internal/integrity"
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
	// Absent when the node could not open its cache (the report's
	// problems say why): no block was checked then.
	BlockBytes int64 `json:"block_bytes,omitempty"`
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
	// The block size is read once the check has run: a node opens its
	// cache when it first needs it, and CheckCache is that first need on
	// a node that has not restored yet.
	defer func() {
		if c.r.Cache != nil {
			c.r.Cache.BlockBytes = blockBytesOf(repo)
		}
	}()
	if !c.res.Record.Layered() {
		return c.checkCached(cc, c.res.Record, c.judge, "")
	}
	// A layered snapshot's blocks are cached per layer, under the layer's
	// SHA-256 as a plain memory's are under its own (s3.Repo).
	for i, l := range c.layerJudges {
		rec := repository.Record{ID: l.desc.Snapshot, MemorySHA256: l.desc.SHA256}
		if err := c.checkCached(cc, rec, l.judge, fmt.Sprintf("layer %d of the chain, owned by %s: ", i, l.desc.Snapshot)); err != nil {
			return err
		}
	}
	return nil
}

// checkCached checks the cached blocks of rec's memory with judge, adds
// them to the report and reports a problem (prefixed with what) for each
// failure.
func (c *checker) checkCached(cc cacheChecker, rec repository.Record, judge *integrity.Table, what string) error {
	if judge == nil {
		c.r.Problems = append(c.r.Problems, Problem{Kind: KindCache,
			Message: what + "the node cache was not checked: the snapshot has no digest table that can be used"})
		return nil
	}
	rep, err := cc.CheckCache(c.ctx, rec, func(off int64, data []byte) error { return judge.Verify(data, off) })
	if err != nil && c.ctx.Err() != nil {
		return c.ctx.Err()
	}
	if c.r.Cache == nil {
		c.r.Cache = &CacheReport{}
	}
	cr := c.r.Cache
	cr.Blocks, cr.Bytes, cr.Evicted = cr.Blocks+rep.Blocks, cr.Bytes+rep.Bytes, append(cr.Evicted, rep.Evicted...)
	if err != nil {
		c.r.Problems = append(c.r.Problems, Problem{Kind: KindCache, Message: what + err.Error()})
	}
	if n := len(rep.Evicted); n > 0 {
		c.r.Problems = append(c.r.Problems, Problem{Kind: KindCache, Message: fmt.Sprintf(
			"%s%d of %d blocks this node cached do not match the digest table and were evicted (the next read fetches them from the store): blocks %v",
			what, n, rep.Blocks, rep.Evicted)})
	}
	return nil
}

// blockBytesOf is the block size of repo's node cache, 0 when it is not
// open.
func blockBytesOf(repo repository.Repository) int64 {
	if cr, ok := findIn[interface{ Cache() *chunkcache.Cache }](repo); ok && cr.Cache() != nil {
		return cr.Cache().BlockBytes()
	}
	return 0
}
