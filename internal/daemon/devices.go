package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"warmstart/internal/memdev"
)

// The daemon holds its own reference to every shared device generation
// its restores run on (memdev.Sharer: the file device's). Holding it lets
// the daemon read the generation's counters for as long as any restore
// uses it, and makes the release of the device a step of its own: each
// restore's stop drops only its reference, and the daemon drops this last
// one once no listed restore runs on the generation, waiting for the
// acknowledgement that no read is in flight. The device counts the
// references; the daemon keeps no count of its own, only which
// generations it holds (d.devices) and which restores it lists
// (d.restores). A device that is one VM's (the uffd device) has nothing to
// share: what it read by ready is what the daemon learns of it.

// deviceOf is the device a listed restore runs on.
func deviceOf(run *running) memdev.ID {
	return memdev.ID{Kind: run.info.Device, Generation: run.info.Generation}
}

// countDevice takes the daemon's reference to the restore's device
// generation, unless it holds it already, or counts what a device of the
// VM's own read by ready. The restore holds its own reference, so the
// daemon joins that generation whatever its memory: a local file or an S3
// memory source. Callers hold d.mu, so no release can decide in between
// that no restore runs on it.
func (d *Daemon) countDevice(run *running) {
	id := deviceOf(run)
	d.devMu.Lock()
	defer d.devMu.Unlock()
	if _, ok := d.devices[id]; ok {
		return
	}
	dev, err := run.inst.Share()
	switch {
	case errors.Is(err, memdev.ErrNotShared):
		d.uffdBytes.Add(run.inst.DeviceBytes.BytesRead)
	case err != nil:
		// Only the byte counts and the separate release step are lost;
		// the restore itself is fine.
		d.log.Warn("restore runs without the daemon's device reference", "restore", run.info.ID, "err", err)
	default:
		d.devices[id] = dev
	}
}

// releaseDevice is called once a restore on id has stopped and left
// d.restores. When no listed restore runs on id any more it releases the
// daemon's reference, waits for the acknowledgement and, when that was the
// generation's last reference, forgets its prefetch tasks: no later
// restore can join them. It returns how long the acknowledgement took.
func (d *Daemon) releaseDevice(ctx context.Context, id memdev.ID) (time.Duration, error) {
	dev := d.takeUnusedDevice(id)
	if dev == nil {
		return 0, nil
	}
	t := time.Now()
	last, err := dev.Release(ctx)
	took := time.Since(t)
	if err != nil {
		return took, fmt.Errorf("release memory device generation %d: %w", id.Generation, err)
	}
	// A restore that has not reached the listing yet may still hold the
	// generation: only the last release ends it, its bytes and its tasks.
	if last {
		d.releasedBytes.Add(dev.Counters().BytesRead)
		d.engine.Forget(id.Kind, id.Generation)
	}
	d.log.Info("device released", "generation", id.Generation, "release_ack", took)
	return took, nil
}

// takeUnusedDevice removes and returns the daemon's reference to id when
// no listed restore runs on it; nil otherwise.
func (d *Daemon) takeUnusedDevice(id memdev.ID) memdev.Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.restores {
		if deviceOf(r) == id {
			return nil
		}
	}
	d.devMu.Lock()
	defer d.devMu.Unlock()
	dev := d.devices[id]
	delete(d.devices, id)
	return dev
}

// heldDevices is how many device generations the daemon holds.
func (d *Daemon) heldDevices() int {
	d.devMu.Lock()
	defer d.devMu.Unlock()
	return len(d.devices)
}

// deviceBytes is every byte the restores' memory devices have read from
// lower files: released shared generations, held ones now, and each
// device of a VM's own up to ready.
func (d *Daemon) deviceBytes() uint64 {
	total := d.releasedBytes.Load() + d.uffdBytes.Load()
	d.devMu.Lock()
	defer d.devMu.Unlock()
	for _, dev := range d.devices {
		total += dev.Counters().BytesRead
	}
	return total
}
