package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"warmstart/internal/capture"
	"warmstart/internal/config"
	"warmstart/internal/initramfs"
	"warmstart/internal/lab/reference"
	"warmstart/internal/lab/workspace"
	"warmstart/internal/restore"
	"warmstart/internal/vmm/qemu"
)

// PrepareReference synthesizes the reference snapshot, publishes it into a
// workspace under dir and records its manifest on device, as a publish
// with recording enabled would. It returns the snapshot and its trace.
func PrepareReference(ctx context.Context, dir, device string, memBytes int64, seed uint64, progress io.Writer) (restore.Source, string, error) {
	ws := workspace.Workspace{Dir: dir, Device: device}
	n, err := ws.Open(ctx)
	if err != nil {
		return restore.Source{}, "", err
	}
	defer n.Close()
	fmt.Fprintf(progress, "synthesizing the %d MiB reference snapshot (seed %d) and publishing it\n", memBytes>>20, seed)
	snap, job, err := reference.Publish(ctx, n.Repo, n.Recorder, reference.Options{Dir: ws.ReferenceDir(), MemoryBytes: memBytes, Seed: seed})
	if err != nil {
		return restore.Source{}, "", err
	}
	res, err := job.Result()
	if err != nil {
		return restore.Source{}, "", err
	}
	fmt.Fprintf(progress, "startup manifest recorded on the %s device and attached: %d ranges, %.1f MiB, sha256 %s\n",
		device, res.Ranges, float64(res.Bytes)/(1<<20), res.Descriptor.SHA256[:16])
	src, err := n.Resolve(ctx, snap.ID)
	return src, snap.Paths.Trace, err
}

// PrepareGuest boots, captures and publishes a fresh real guest into a
// workspace under dir and records its manifest from the guest's own
// device reads, as warmstart capture with recording enabled does. It
// returns the snapshot and what its agent answered before the capture
// (token and heap digest), which every restored guest must answer again.
func PrepareGuest(ctx context.Context, d *qemu.Driver, dir, initramfsCache, agent string, progress io.Writer) (restore.Source, map[string]string, error) {
	n, err := workspace.Workspace{Dir: dir, Device: config.DeviceFile, VMM: d}.Open(ctx)
	if err != nil {
		return restore.Source{}, nil, err
	}
	defer n.Close()
	snap, job, err := capture.Publish(ctx, n.Repo, n.Recorder, capture.Options{
		Booter:     &capture.QEMU{Driver: d, Initramfs: initramfs.Options{CacheDir: initramfsCache, Agent: agent}},
		StagingDir: n.Repo.(interface{ Root() string }).Root(),
		RuntimeDir: n.Restorer.RuntimeDir,
		Progress:   progress,
	})
	if err != nil {
		return restore.Source{}, nil, err
	}
	res, err := job.Result()
	if err != nil {
		return restore.Source{}, nil, err
	}
	fmt.Fprintf(progress, "guest snapshot %s captured under %s (boot to agent %v); startup manifest recorded from its device reads and attached: %d ranges, %.1f MiB, sha256 %s\n",
		snap.Record.ID, snap.Accel, snap.Boot.Round(time.Millisecond), res.Ranges, float64(res.Bytes)/(1<<20), res.Descriptor.SHA256[:16])
	src, err := n.Resolve(ctx, snap.Record.ID)
	return src, snap.Ready.Detail, err
}
