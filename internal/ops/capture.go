package ops

import (
	"context"
	"errors"
	"fmt"
	"io"

	"warmstart/internal/agentspec"
	"warmstart/internal/capture"
	"warmstart/internal/config"
	"warmstart/internal/initramfs"
	"warmstart/internal/node"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/vmm/firecracker"
	"warmstart/internal/vmm/qemu"
)

// Capture boots, captures and publishes a guest into n's repository with
// n's VMM (agent is a prebuilt warmstart-agent for a QEMU guest, "" to
// build it). When [manifest] record_after_publish is on, the
// returned job records its manifest in the background.
func Capture(ctx context.Context, n *node.Node, alias, agent string, progress io.Writer) (capture.Snapshot, *recorder.Job, error) {
	booter, err := booter(n, agent)
	if err != nil {
		return capture.Snapshot{}, nil, err
	}
	var rec *recorder.Recorder
	if n.Config.Manifest.RecordAfterPublish {
		rec = n.Recorder
	}
	return capture.Publish(ctx, n.Repo, rec, capture.Options{
		Booter:     booter,
		StagingDir: stagingDir(n),
		RuntimeDir: n.Restorer.RuntimeDir,
		Alias:      alias,
		Progress:   progress,
	})
}

// booter is what boots a fresh guest with n's VMM.
func booter(n *node.Node, agent string) (capture.Booter, error) {
	switch d := n.VMM.(type) {
	case *qemu.Driver:
		return &capture.QEMU{Driver: d, Initramfs: initramfs.Options{
			CacheDir: node.InitramfsCache(n.Config),
			Agent:    agent,
		}}, nil
	case *firecracker.Driver:
		fc := n.Config.Firecracker
		if fc.Kernel == "" {
			return nil, errors.New("capture: [firecracker] kernel is empty: a fresh Firecracker VM boots from it")
		}
		return &capture.Firecracker{Driver: d, Spec: firecracker.BootSpec{
			Kernel: fc.Kernel, Rootfs: fc.Rootfs, RootfsReadOnly: true,
			VCPUs: fc.VCPUs, MemoryMiB: fc.MemoryMiB,
		}}, nil
	default:
		return nil, fmt.Errorf("capture: the %T VMM cannot boot a guest", n.VMM)
	}
}

// stagingDir is where a capture writes the guest's memory file: inside the
// POSIX store, so that publishing hard-links it rather than copying it (a
// hidden .capture-* directory the store's own layout never uses), or the
// runtime directory for other backends.
func stagingDir(n *node.Node) string {
	if r, ok := n.Repo.(interface{ Root() string }); ok {
		return r.Root()
	}
	return n.Restorer.RuntimeDir
}

// CheckCapture refuses what no capture can do, before anything starts:
// a VMM that cannot boot a guest (kind), an agent or an agent workload a
// Firecracker guest does not take, a malformed workload or alias. Its
// errors name the flag.
func CheckCapture(kind, agent, workload, alias string) error {
	switch kind {
	case config.DriverQEMU:
		if _, err := agentspec.ParseWorkload(workload); workload != "" && err != nil {
			return fmt.Errorf("--agent-workload: %w", err)
		}
	case config.DriverFirecracker:
		if workload != "" {
			return errors.New("--agent-workload: only the QEMU test guest's agent has a workload")
		}
		if agent != "" {
			return errors.New("--agent: a Firecracker guest's agent comes with its [firecracker] rootfs")
		}
	default:
		return fmt.Errorf("--vmm %q: only qemu and firecracker boot and capture a guest", kind)
	}
	if alias != "" {
		if err := repository.ValidateNewAlias(alias); err != nil {
			return fmt.Errorf("capture: --alias: %w", err)
		}
	}
	return nil
}
