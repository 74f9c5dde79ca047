package s3

import (
	"context"
	"errors"
	"fmt"
	"os"

	"warmstart/internal/repository"
)

// storeViewCacheBytes bounds a store view's memory blocks when the
// repository it copies shares a node cache (and so has no bound of its
// own). Verify reads memory past the cache; the view caches little.
const storeViewCacheBytes = 64 << 20

// StoreView opens this repository again as a node that has cached
// nothing: the same bucket, prefix and client, with a node cache of its
// own in a fresh directory and no background fill. snapshot verify reads
// through it, so that nothing this node cached (a VM state, a manifest, a
// digest table, a chunk map, a pack index, memory blocks) stands in for
// what the store holds and every other node reads. closeView closes the
// view and removes its directory.
func (r *Repo) StoreView(ctx context.Context) (view repository.Repository, closeView func() error, err error) {
	dir, err := os.MkdirTemp("", "warmstart-verify-")
	if err != nil {
		return nil, nil, fmt.Errorf("s3 store view: %w", err)
	}
	o := r.opts
	o.CacheDir, o.Cache = dir, nil
	if o.CacheMaxBytes <= 0 {
		o.CacheMaxBytes = storeViewCacheBytes
	}
	o.Fill.Disabled = true
	v, err := Open(ctx, o)
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("s3 store view: %w", err), os.RemoveAll(dir))
	}
	return v, func() error { return errors.Join(v.Close(), os.RemoveAll(dir)) }, nil
}
