package node

import (
	"fmt"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/qemu"
)

// mounts are the file device's mounts of one restorer.
type mounts struct {
	serving, prefetching *fusedev.Server
}

// mountDevices mounts the serving mount at o.Mount and, when its window
// differs, the prefetching one beside it.
func mountDevices(o RestorerOptions) (*mounts, error) {
	opts := FUSEOptions(o.FUSE, o.VMM)
	serving, err := fusedev.Mount(o.Mount, opts)
	if err != nil {
		return nil, errMount(err)
	}
	m := &mounts{serving: serving}
	dir := o.PrefetchMount
	if dir == "" {
		dir = o.Mount + "-prefetching"
	}
	if m.prefetching, err = mountPrefetching(dir, serving, opts, o.PrefetchReadAheadBytes); err != nil {
		serving.Close()
		return nil, errMount(err)
	}
	return m, nil
}

// devices are the memory devices a node's restores attach through: the
// file device on m (the default), then the uffd device.
func (m *mounts) devices(uffdConnectTimeout time.Duration) memdev.Devices {
	return memdev.Devices{fusedev.NewOpener(m.serving, m.prefetching), uffd.NewOpener(uffdConnectTimeout)}
}

// close unmounts the prefetching mount, then the serving one.
func (m *mounts) close() error {
	var closePrefetching func() error
	if m.prefetching != nil {
		closePrefetching = m.prefetching.Close
	}
	return closeAll(closePrefetching, m.serving.Close)
}

// mountPrefetching mounts at dir the file device of restores that
// prefetch: serving's options (opts) with their readaround window
// (config.MemoryConfig.PrefetchReadaroundBytes). It returns nil, nil when
// the serving mount's window is that one already: the serving mount then
// serves those restores too.
func mountPrefetching(dir string, serving *fusedev.Server, opts fusedev.Options, window int) (*fusedev.Server, error) {
	if window <= 0 || serving.ReadAheadBytes() == window {
		return nil, nil
	}
	opts.ReadAheadBytes = window
	// A guest that misses its manifest gets the serving mount's window
	// around the miss, filled after the one-page read is answered: it
	// pays no more for a page outside the manifest than with prefetch off.
	opts.MissFillBytes = serving.ReadAheadBytes()
	srv, err := fusedev.Mount(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("prefetching mount: %w", err)
	}
	return srv, nil
}

// FUSEOptions are base, with writable opens when vm is QEMU, which opens
// its memory file read-write before it maps it private (the device still
// refuses writes).
func FUSEOptions(base fusedev.Options, vm vmm.VMM) fusedev.Options {
	if _, ok := vm.(*qemu.Driver); ok {
		base.AllowWriteOpen = true
	}
	return base
}
