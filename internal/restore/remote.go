package restore

import (
	"fmt"
	"sync"

	"warmstart/internal/config"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev/fusedev"
)

// Snapshots whose memory stays in a remote store (the S3 repository) come
// with a repository.MemorySource instead of a local memory file. The file
// device serves them from a reader of that source; the uffd device needs a
// local file and refuses them.

// CacheWarmer is a memory source with a node-local cache below the memory
// device (the S3 repository's chunk cache). When a restore prefetches, it
// hands the source the manifest's ranges in first-touch order before the
// device prefetch starts: the source's executor fetches them into its cache
// with its own bounded concurrency, and the device prefetch's and the
// guest's reads then hit that cache or wait on its fetches in flight.
type CacheWarmer interface {
	// WarmCache starts the fetches and returns at once; stop cancels what
	// has not been fetched and waits for the fetches in progress.
	WarmCache(ranges []manifest.Range) (stop func(), err error)
}

// ReadyNotifier is a memory source that wants to know when a restore of
// it is ready: its startup set is in, so background work on the node (the
// S3 chunk cache's fill of the rest of the memory) may start without
// competing with the restore's own fetches.
type ReadyNotifier interface {
	RestoreReady()
}

// noteReady tells src's memory source, if it asks, that a restore is ready.
func noteReady(src Source) {
	if n, ok := src.Memory.(ReadyNotifier); ok {
		n.RestoreReady()
	}
}

// attachFileDevice attaches the file device for src: a generation serving
// its local memory file, or a reader of its remote memory source.
func (r *Restorer) attachFileDevice(key string, src Source, ioEngine int, v *fusedev.Verifier) (*fusedev.Device, error) {
	if src.Memory == nil {
		return r.FUSE.AttachVerified(key, src.MemoryPath, ioEngine, v)
	}
	open := func() (fusedev.Lower, error) { return src.Memory.OpenMemory() }
	return r.FUSE.AttachLowerVerified(key, src.Memory.Ref(), open, ioEngine, v)
}

// checkDevice refuses device and source pairs that cannot work.
func checkDevice(src Source, device string) error {
	if src.Memory != nil && device == config.DeviceUffd {
		return fmt.Errorf("restore %s: the uffd device serves a local memory file; "+
			"snapshots read from a remote repository restore on the file device", src.SnapshotID)
	}
	return nil
}

// startCacheWarm starts warming the memory source's cache with m's ranges
// when the source has one. A failure to start only means the device
// prefetch and the guest fetch on demand.
func (inst *Instance) startCacheWarm(src Source, m *manifest.Manifest) {
	w, ok := src.Memory.(CacheWarmer)
	if !ok {
		return
	}
	stop, err := w.WarmCache(m.Ranges)
	if err != nil {
		if inst.r.Log != nil {
			inst.r.Log.Warn("cache prefetch not started", "snapshot", src.SnapshotID, "err", err)
		}
		return
	}
	inst.warmStop = sync.OnceFunc(stop)
}

// stopCacheWarm cancels the cache prefetch and waits for its fetches.
func (inst *Instance) stopCacheWarm() {
	if inst.warmStop != nil {
		inst.warmStop()
	}
}
