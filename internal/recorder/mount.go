package recorder

import (
	"fmt"

	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/prefetch"
	"warmstart/internal/restore"
)

// TraceReadAheadBytes is the readahead window of the recorder's FUSE mount:
// one page, so that every read request is a page the guest touched. With
// the serving mount's window (128 KiB) each fault would also record the
// neighbours the kernel reads around it, and the manifest of the reference
// snapshot would cover 120 MiB for a 40 MiB working set.
const TraceReadAheadBytes = 4096

// TracingRestorer returns a restorer for recording: base's VMM and runtime
// directory (never base's Observe: recording restores are throwaway and
// traced, and would only blur restore metrics), with its own FUSE mount at dir whose read requests are exactly
// the touched pages, and its own prefetch engine (recording never
// prefetches, and the mount numbers its generations apart from base's).
// close unmounts it.
func TracingRestorer(base *restore.Restorer, dir string) (r *restore.Restorer, close func() error, err error) {
	return TracingRestorerWith(base, dir, fusedev.Options{})
}

// TracingRestorerWith is TracingRestorer with the tracing mount's options
// taken from mount, which should be the serving mount's: a VMM that needs
// AllowWriteOpen there (QEMU) needs it on the tracing mount too. The
// readahead window is always TraceReadAheadBytes.
func TracingRestorerWith(base *restore.Restorer, dir string, mount fusedev.Options) (r *restore.Restorer, close func() error, err error) {
	mount.ReadAheadBytes = TraceReadAheadBytes
	srv, err := fusedev.Mount(dir, mount)
	if err != nil {
		return nil, nil, fmt.Errorf("recorder mount: %w", err)
	}
	r = &restore.Restorer{
		Devices:    tracingDevices(base.Devices, srv),
		Engine:     prefetch.NewEngine(prefetch.Options{}),
		VMM:        base.VMM,
		RuntimeDir: base.RuntimeDir,
		Log:        base.Log,
		Trust:      base.Trust,
	}
	return r, srv.Close, nil
}

// tracingDevices are base's devices with the file device on srv.
func tracingDevices(base memdev.Devices, srv *fusedev.Server) memdev.Devices {
	ds := memdev.Devices{fusedev.NewOpener(srv, nil)}
	for _, o := range base {
		if o.Kind() != memdev.KindFile {
			ds = append(ds, o)
		}
	}
	return ds
}
