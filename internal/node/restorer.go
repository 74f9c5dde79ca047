package node

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/prefetch"
	"warmstart/internal/recorder"
	"warmstart/internal/restore"
	"warmstart/internal/trust"
	"warmstart/internal/vmm"
)

// RestorerOptions are the values a restorer is assembled from: Open
// derives them from the configuration, the benchmark's trial from its
// spec.
type RestorerOptions struct {
	VMM        vmm.VMM
	RuntimeDir string
	// Mount and PrefetchMount are the FUSE mount points of the file
	// device; PrefetchMount "" is Mount+"-prefetching".
	Mount, PrefetchMount string
	// FUSE are the serving mount's options (ReadAheadBytes set: its
	// readaround window); AllowWriteOpen is added for QEMU (FUSEOptions).
	FUSE fusedev.Options
	// PrefetchReadAheadBytes is the window of the mount of the restores
	// that prefetch; 0, or equal to the serving mount's, there is no
	// second mount and the serving one serves them too.
	PrefetchReadAheadBytes int
	Engine                 prefetch.Options
	ConsumeEnabled, Refine bool
	// UffdConnectTimeout bounds a uffd restore's wait for its VMM.
	UffdConnectTimeout time.Duration
	Log                *slog.Logger
	Observe            restore.Observer
	Trust              *trust.Policy
}

// Restoring is an assembled restorer and the device mounts it attaches on.
type Restoring struct {
	Restorer *restore.Restorer
	// FUSE is the serving mount; PrefetchFUSE the prefetching one, nil
	// when FUSE serves those restores too.
	FUSE, PrefetchFUSE *fusedev.Server
	// Close unmounts them, the prefetching mount first.
	Close func() error
}

// OpenRestorer mounts the file device and builds a restorer on it, with
// its own prefetch engine and every memory device (devices.go). It is the
// one place a restore.Restorer is made outside tests. On error nothing of
// it is left mounted.
func OpenRestorer(o RestorerOptions) (*Restoring, error) {
	m, err := mountDevices(o)
	if err != nil {
		return nil, err
	}
	r := &restore.Restorer{
		Devices:        m.devices(o.UffdConnectTimeout),
		Engine:         prefetch.NewEngine(o.Engine),
		VMM:            o.VMM,
		ConsumeEnabled: o.ConsumeEnabled,
		Refine:         o.Refine,
		RuntimeDir:     o.RuntimeDir,
		Log:            o.Log,
		Observe:        o.Observe,
		Trust:          o.Trust,
	}
	return &Restoring{Restorer: r, FUSE: m.serving, PrefetchFUSE: m.prefetching, Close: m.close}, nil
}

// TracingOptions is o for the recorder: its own mount at dir whose window
// is recorder.TraceReadAheadBytes (so that every read request is a page
// the guest touched), no prefetching mount, its own engine (recording
// never prefetches, and the mount numbers its generations apart), and no
// Observe (recording restores are throwaway and traced, and would only
// blur restore metrics). The serving mount's AllowWriteOpen is kept: the
// same VMM restores on it; its test hooks are not.
func TracingOptions(o RestorerOptions, dir string) RestorerOptions {
	t := o
	t.Mount, t.PrefetchMount = dir, ""
	t.FUSE = fusedev.Options{ReadAheadBytes: recorder.TraceReadAheadBytes, AllowWriteOpen: o.FUSE.AllowWriteOpen, Log: o.FUSE.Log}
	t.PrefetchReadAheadBytes = 0
	t.Engine = prefetch.Options{}
	t.Observe = nil
	return t
}

// closeAll closes in order and joins the errors.
func closeAll(closers ...func() error) error {
	var errs []error
	for _, c := range closers {
		if c != nil {
			errs = append(errs, c())
		}
	}
	return errors.Join(errs...)
}

// errMount wraps a mount failure of the node.
func errMount(err error) error { return fmt.Errorf("node: %w", err) }
