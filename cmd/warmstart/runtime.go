package main

import (
	"errors"
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
	// agentWorkload, when set, overrides [qemu] agent_workload (capture).
	agentWorkload string
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

// openSystem assembles the node an in-process verb restores with, from
// --config and the VMM flags. Its FUSE mounts live in a runtime directory
// private to this process, so verbs run side by side; Close removes it.
func openSystem(cmd *cobra.Command, vf *vmmFlags) (*node.Node, error) {
	cfg, err := loadConfig()
	if err != nil {
		return nil, err
	}
	vf.fromConfig(cmd, cfg)
	if vf.agentWorkload != "" {
		cfg.QEMU.AgentWorkload = vf.agentWorkload
	}
	if cfg, err = node.WithVMM(cfg, vf.kind, vf.trace); err != nil {
		if fe := (*node.FlagError)(nil); errors.As(err, &fe) {
			return nil, usageError{Err: err}
		}
		return nil, err
	}
	repo, err := openRepositoryAs(cmd, vf.readOnly)
	if err != nil {
		return nil, err
	}
	// A read-only store cannot take the refinement a learner would attach
	// (every restore would end with a warning that it failed), so such a
	// node uses the refined manifest a snapshot has and learns nothing.
	return node.OpenCLI(cmd.Context(), cfg, repo, vf.readOnly, os.Stderr)
}
