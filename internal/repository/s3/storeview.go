package s3

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"warmstart/internal/repository"
)

const (
	// storeViewCacheBytes bounds a store view's memory blocks when the
	// repository it copies shares a node cache (and so has no bound of
	// its own). Verify reads memory past the cache; the view caches little.
	storeViewCacheBytes = 64 << 20
	// storeViewPrefix names a view's directory in the node's cache dir.
	storeViewPrefix = "verify-"
	// staleStoreViewAge is when a view's directory is taken for the
	// leftover of a verify that was killed: no verify takes a day.
	staleStoreViewAge = 24 * time.Hour
)

// StoreView opens this repository again as a node that has cached
// nothing: the same bucket, prefix and client, with a node cache of its
// own in a fresh directory under the node's cache dir and no background
// fill. snapshot verify reads through it, so that nothing this node
// cached (a VM state, a manifest, a digest table, a chunk map, a pack
// index, memory blocks) stands in for what the store holds and every
// other node reads. closeView closes the view and removes its directory;
// views a killed verify left behind are removed once a day old.
func (r *Repo) StoreView(context.Context) (view repository.Repository, closeView func() error, err error) {
	removeStaleStoreViews(r.opts.CacheDir, time.Now())
	if err := os.MkdirAll(r.opts.CacheDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("s3 store view: %w", err)
	}
	dir, err := os.MkdirTemp(r.opts.CacheDir, storeViewPrefix)
	if err != nil {
		return nil, nil, fmt.Errorf("s3 store view: %w", err)
	}
	o := r.opts
	o.CacheDir, o.Cache = dir, nil
	if o.CacheMaxBytes <= 0 {
		o.CacheMaxBytes = storeViewCacheBytes
	}
	o.Fill.Disabled = true
	v, err := newRepo(o, r.keys.prefix, r.core, r.counter)
	if err == nil && !o.ReadOnly {
		err = v.openLocal()
	}
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("s3 store view: %w", err), os.RemoveAll(dir))
	}
	return v, func() error { return errors.Join(v.Close(), os.RemoveAll(dir)) }, nil
}

// removeStaleStoreViews removes the view directories in cacheDir older
// than staleStoreViewAge. Failures leave them for the next time.
func removeStaleStoreViews(cacheDir string, now time.Time) {
	entries, err := os.ReadDir(cacheDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), storeViewPrefix) {
			continue
		}
		if info, err := e.Info(); err == nil && now.Sub(info.ModTime()) > staleStoreViewAge {
			_ = os.RemoveAll(filepath.Join(cacheDir, e.Name()))
		}
	}
}
