package daemon

import (
	"context"
	"fmt"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/memdev/fusedev"
)

// heldDevice is the daemon's own reference to a file device generation
// that its restores run on. Holding it lets the daemon read the
// generation's counters for as long as any restore uses it, and makes the
// release of the device a step of its own: each restore's stop drops only
// its reference, and the daemon drops this last one once the last of them
// has stopped, waiting for the acknowledgement that no read is in flight.
type heldDevice struct {
	dev      *fusedev.Device
	restores int
}

// holdDevice records one more restore on generation gen of the file device
// key; the restore holds its own reference, so the attach joins its
// generation rather than creating one.
func (d *Daemon) holdDevice(key, lowerPath string, ioEngine int, gen uint64) error {
	d.devMu.Lock()
	defer d.devMu.Unlock()
	if h, ok := d.devices[gen]; ok {
		h.restores++
		return nil
	}
	dev, err := d.fuse.Attach(key, lowerPath, ioEngine)
	if err != nil {
		return fmt.Errorf("hold memory device %s: %w", key, err)
	}
	if dev.Generation() != gen {
		dev.Release()
		return fmt.Errorf("hold memory device %s: attached generation %d, the restore runs on %d", key, dev.Generation(), gen)
	}
	d.devices[gen] = &heldDevice{dev: dev, restores: 1}
	return nil
}

// releaseDevice records that a restore on gen has stopped. After the last
// one it releases the daemon's reference, waits for the acknowledgement,
// and forgets the generation's prefetch tasks: no later restore can join
// them. It returns how long the acknowledgement took.
func (d *Daemon) releaseDevice(ctx context.Context, gen uint64) (time.Duration, error) {
	d.devMu.Lock()
	h, ok := d.devices[gen]
	if !ok {
		d.devMu.Unlock()
		return 0, nil
	}
	if h.restores--; h.restores > 0 {
		d.devMu.Unlock()
		return 0, nil
	}
	delete(d.devices, gen)
	t := time.Now()
	ack := h.dev.Release()
	d.devMu.Unlock()
	select {
	case <-ack:
	case <-ctx.Done():
		return time.Since(t), fmt.Errorf("release memory device generation %d: %w", gen, ctx.Err())
	}
	took := time.Since(t)
	d.releasedBytes.Add(h.dev.Counters().BytesRead)
	d.engine.Forget(config.DeviceFile, gen)
	d.log.Info("device released", "generation", gen, "release_ack", took)
	return took, nil
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
	for _, h := range d.devices {
		total += h.dev.Counters().BytesRead
	}
	return total
}
