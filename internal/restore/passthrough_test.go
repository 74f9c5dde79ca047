package restore_test

import (
	"path/filepath"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/prefetch"
	"warmstart/internal/restore"
	"warmstart/internal/restore/restoretest"
)

// TestPassthroughRestoreSaysItServedUncheckedMemory restores on a mount
// with FUSE passthrough: the guest reads the snapshot's bytes, the device
// reads and copies none of them (prefetch is readahead of the memory
// file), the restore says it was served unchecked, counts the prefetched
// ranges in time, and leaves nothing to learn from; the same restore
// without passthrough reads through the device and is learned from.
func TestPassthroughRestoreSaysItServedUncheckedMemory(t *testing.T) {
	e := newEnv(t, envOptions{})
	src := e.source(t)
	pt, err := fusedev.Mount(filepath.Join(e.dir, "mnt-passthrough"), fusedev.Options{Passthrough: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pt.Close() })
	r := &restore.Restorer{Devices: restoretest.Devices(pt, nil), Engine: prefetch.NewEngine(prefetch.Options{}),
		VMM: e.vm, RuntimeDir: filepath.Join(e.dir, "run-pt"), Log: e.restorer.Log}
	opts := restore.Options{Device: config.DeviceFile, Prefetch: restore.ModeOn}

	inst := e.restore(t, r, src, opts)
	checkHash(t, inst, e.ref.expected)
	if !inst.Passthrough || inst.Observation != nil {
		t.Errorf("passthrough %v, observation %v: want passthrough said and nothing to learn from", inst.Passthrough, inst.Observation != nil)
	}
	if inst.DeviceBytes.ReadRequests != 0 || inst.Cost.CopiedBytes != 0 {
		t.Errorf("device %+v, %d bytes copied: want the kernel to serve the guest", inst.DeviceBytes, inst.Cost.CopiedBytes)
	}
	if inst.StartupSet.InTimePages+inst.StartupSet.LatePages == 0 || inst.StartupSet.PrefetchBytes == 0 {
		t.Errorf("startup set %+v: want the prefetched ranges counted", inst.StartupSet)
	}
	stop(t, inst)

	checked := e.restore(t, e.restorer, src, opts)
	checkHash(t, checked, e.ref.expected)
	if checked.Passthrough || checked.Observation == nil || checked.DeviceBytes.BytesRead == 0 {
		t.Errorf("default mount: passthrough %v, observation %v, device %+v", checked.Passthrough, checked.Observation != nil, checked.DeviceBytes)
	}
	stop(t, checked)
}
