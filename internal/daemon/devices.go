package daemon

import (
	"context"
	"fmt"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/memdev/fusedev"
)

// The daemon holds its own reference to every file device generation its
// restores run on. Holding it lets the daemon read the generation's
// counters for as long as any restore uses it, and makes the release of the
// device a step of its own: each restore's stop drops only its reference,
// and the daemon drops this last one once no listed restore runs on the
// generation, waiting for the acknowledgement that no read is in flight.
// The device counts the references; the daemon keeps no count of its own,
// only which generations it holds (d.devices) and which restores it lists
// (d.restores).

// holdDevice takes the daemon's reference to generation gen of the file
// device key on srv, the mount the restore runs on (its serving or its
// prefetching mount), unless it holds it already. The restore holds its
// own reference, so the daemon joins that generation (fusedev.Server.Hold)
// whatever its lower: a local memory file or an S3 memory source.
// Generation numbers are unique across mounts. Callers hold d.mu, so no
// release can decide in between that no restore runs on gen.
func (d *Daemon) holdDevice(srv *fusedev.Server, key string, gen uint64) error {
	d.devMu.Lock()
	defer d.devMu.Unlock()
	if _, ok := d.devices[gen]; ok {
		return nil
	}
	if srv == nil {
		srv = d.fuse
	}
	dev, err := srv.Hold(key, gen)
	if err != nil {
		return fmt.Errorf("hold memory device %s: %w", key, err)
	}
	d.devices[gen] = dev
	return nil
}

// releaseDevice is called once a restore on gen has stopped and left
// d.restores. When no listed restore runs on gen any more it releases the
// daemon's reference, waits for the acknowledgement and, when that was the
// generation's last reference, forgets its prefetch tasks: no later
// restore can join them. It returns
// how long the acknowledgement took.
func (d *Daemon) releaseDevice(ctx context.Context, gen uint64) (time.Duration, error) {
	dev := d.takeUnusedDevice(gen)
	if dev == nil {
		return 0, nil
	}
	t := time.Now()
	select {
	case <-dev.Release():
	case <-ctx.Done():
		return time.Since(t), fmt.Errorf("release memory device generation %d: %w", gen, ctx.Err())
	}
	took := time.Since(t)
	// A restore that has not reached the listing yet may still hold the
	// generation: only the last release ends it, its bytes and its tasks.
	if dev.ReleasedLast() {
		d.releasedBytes.Add(dev.Counters().BytesRead)
		d.engine.Forget(config.DeviceFile, gen)
	}
	d.log.Info("device released", "generation", gen, "release_ack", took)
	return took, nil
}

// takeUnusedDevice removes and returns the daemon's reference to gen when
// no listed restore runs on it; nil otherwise.
func (d *Daemon) takeUnusedDevice(gen uint64) *fusedev.Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.restores {
		if r.info.Device == config.DeviceFile && r.info.Generation == gen {
			return nil
		}
	}
	d.devMu.Lock()
	defer d.devMu.Unlock()
	dev := d.devices[gen]
	delete(d.devices, gen)
	return dev
}

// heldDevices is how many device generations the daemon holds.
func (d *Daemon) heldDevices() int {
	d.devMu.Lock()
	defer d.devMu.Unlock()
	return len(d.devices)
}

// deviceBytes is every byte the restores' memory devices have read from
// lower files: released file device generations, held ones now, and each
// uffd restore's session up to ready.
func (d *Daemon) deviceBytes() uint64 {
	total := d.releasedBytes.Load() + d.uffdBytes.Load()
	d.devMu.Lock()
	defer d.devMu.Unlock()
	for _, dev := range d.devices {
		total += dev.Counters().BytesRead
	}
	return total
}
