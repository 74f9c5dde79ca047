package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"warmstart/internal/config"
	"warmstart/internal/node"
)

// vmmFlags are the flags that choose and feed a VMM driver.
type vmmFlags struct {
	kind  string
	trace string
	// readOnly opens the repository read-only (restore only reads it).
	readOnly bool
}

func (f *vmmFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.kind, "vmm", "", "VMM driver: replay (stand-in process), qemu or firecracker (default: [vmm] driver; replay when --trace is given)")
	cmd.Flags().StringVar(&f.trace, "trace", "", "startup trace the replay VMM plays, from warmstart synth (default: [replay] trace)")
}

// fromConfig fills the flags left unset from cfg, as the daemon reads
// them: [vmm] driver and [replay] trace. --trace alone names the replay
// VMM, the only driver that plays a trace. A verb whose --vmm has a
// default of its own (capture boots QEMU unless told otherwise) keeps it.
func (f *vmmFlags) fromConfig(cmd *cobra.Command, cfg *config.Config) {
	traceSet := cmd.Flags().Changed("trace")
	if f.kind == "" {
		f.kind = cfg.VMM.Driver
		if traceSet {
			f.kind = config.DriverReplay
		}
	}
	if !traceSet {
		f.trace = cfg.Replay.Trace
	}
}

// vmmConfig is cfg with [vmm] driver and [replay] trace taken from the
// flags, checked here so that a bad flag is named as one.
func (f *vmmFlags) vmmConfig(cfg *config.Config) (*config.Config, error) {
	c := *cfg
	c.VMM.Driver, c.Replay.Trace = f.kind, f.trace
	switch f.kind {
	case config.DriverReplay:
		if f.trace == "" {
			return nil, usageError{Err: fmt.Errorf("--vmm replay needs --trace FILE (warmstart synth writes one)")}
		}
		if _, err := os.Stat(f.trace); err != nil {
			return nil, fmt.Errorf("--trace: %w", err)
		}
	case config.DriverQEMU:
	case config.DriverFirecracker:
		// Ready is the guest agent answering: refused here rather than
		// after the first VM has started.
		if cfg.Envd.Address == "" {
			return nil, fmt.Errorf("--vmm firecracker: [envd] address is empty; set it to the guest agent's health endpoint (vsock:PORT, unix:PATH or http://HOST:PORT/health)")
		}
	default:
		return nil, usageError{Err: fmt.Errorf("--vmm %q: want replay, qemu or firecracker", f.kind)}
	}
	return &c, nil
}

// openSystem assembles the node an in-process verb restores with, from
// --config and the VMM flags. Its FUSE mounts live in a runtime directory
// private to this process, so verbs run side by side; Close removes it.
func openSystem(cmd *cobra.Command, vf *vmmFlags) (*node.Node, error) {
	cfg, err := loadConfig()
	if err != nil {
		return nil, err
	}
	vf.fromConfig(cmd, cfg)
	if cfg, err = vf.vmmConfig(cfg); err != nil {
		return nil, err
	}
	repo, err := openRepositoryAs(cmd, vf.readOnly)
	if err != nil {
		return nil, err
	}
	return node.OpenCLI(cmd.Context(), cfg, repo, os.Stderr)
}
