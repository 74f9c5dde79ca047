package cli

import (
	"context"
	"errors"
	"os"

	"github.com/spf13/cobra"

	"warmstart/internal/config"
	"warmstart/internal/node"
)

// VMMFlags are the flags that choose and feed a VMM driver.
type VMMFlags struct {
	Kind  string
	Trace string
	// ReadOnly opens the repository read-only (restore only reads it).
	ReadOnly bool
	// AgentWorkload, when set, overrides [qemu] agent_workload (capture).
	AgentWorkload string
	// Check, when set, is asked by OpenNode once the configuration and the
	// driver (resolved, not auto) are known, before anything is opened,
	// mounted or started; what it refuses is a usage error.
	Check func(cfg *config.Config, driver string) error
}

// Register gives cmd --vmm and --trace.
func (f *VMMFlags) Register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.Kind, "vmm", "", "VMM driver: auto (firecracker where it and KVM work, else qemu), replay (stand-in process), qemu or firecracker (default: [vmm] driver; replay when --trace is given)")
	cmd.Flags().StringVar(&f.Trace, "trace", "", "startup trace the replay VMM plays, from warmstart synth (default: [replay] trace)")
}

// fromConfig fills the flags left unset from cfg, as the daemon reads
// them: [vmm] driver and [replay] trace. --trace alone names the replay
// VMM, the only driver that plays a trace. A verb whose --vmm has a
// default of its own (capture boots QEMU unless told otherwise) keeps it.
func (f *VMMFlags) fromConfig(cmd *cobra.Command, cfg *config.Config) {
	traceSet := cmd.Flags().Changed("trace")
	if f.Kind == "" {
		f.Kind = cfg.VMM.Driver
		if traceSet {
			f.Kind = config.DriverReplay
		}
	}
	if !traceSet {
		f.Trace = cfg.Replay.Trace
	}
}

// OpenNode assembles the node an in-process verb restores with, from the
// configuration and the VMM flags. Its FUSE mounts live in a runtime
// directory private to this process, so verbs run side by side; Close
// removes it. ctx is the verb's own (cancelled by a signal): building the
// VMM may boot a probe guest for up to half a minute.
func (e *Env) OpenNode(ctx context.Context, cmd *cobra.Command, vf *VMMFlags) (*node.Node, error) {
	cfg, err := e.Config()
	if err != nil {
		return nil, err
	}
	vf.fromConfig(cmd, cfg)
	if vf.Kind == config.DriverAuto {
		if vf.Kind, err = node.ResolveDriver(ctx, cfg); err != nil {
			return nil, err
		}
	}
	if vf.AgentWorkload != "" {
		c := *cfg
		c.QEMU.AgentWorkload = vf.AgentWorkload
		cfg = &c
	}
	if cfg, err = node.WithVMM(cfg, vf.Kind, vf.Trace); err != nil {
		if fe := (*node.FlagError)(nil); errors.As(err, &fe) {
			return nil, Error{Err: err}
		}
		return nil, err
	}
	if vf.Check != nil {
		if err := vf.Check(cfg, vf.Kind); err != nil {
			return nil, Error{Err: err}
		}
	}
	repo, err := e.openRepository(cmd, vf.ReadOnly)
	if err != nil {
		return nil, err
	}
	// A read-only store cannot take the refinement a learner would attach
	// (every restore would end with a warning that it failed), so such a
	// node uses the refined manifest a snapshot has and learns nothing.
	return node.OpenCLI(ctx, cfg, repo, vf.ReadOnly, os.Stderr)
}
