package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"warmstart/internal/config"
	"warmstart/internal/durable"
	"warmstart/internal/lab/synth"
	"warmstart/internal/node"
	"warmstart/internal/restore"
	"warmstart/internal/vmm/qemu"
)

// UseGuest makes a freshly captured QEMU guest, prepared in o.WorkDir, the
// benchmark's snapshot: what bench --vmm qemu measures without a named
// snapshot. agent is a prebuilt guest agent, or empty to build it.
func UseGuest(ctx context.Context, o *Options, cfg *config.Config, agent string) error {
	d, err := node.NewQEMU(ctx, cfg)
	if err != nil {
		return err
	}
	src, ready, err := PrepareGuest(ctx, d, o.WorkDir, node.InitramfsCache(cfg), agent, o.Progress)
	if err != nil {
		return err
	}
	o.Source, o.ExpectedToken, o.ExpectedDigest = src, ready["token"], ready["digest"]
	o.VMM, o.QEMU = config.DriverQEMU, d.Options()
	return nil
}

// UseReference makes the reference snapshot of memBytes, synthesized in
// o.WorkDir from o.Seed, the benchmark's snapshot, played by the replay VMM.
func UseReference(ctx context.Context, o *Options, memBytes int64) error {
	src, tracePath, err := PrepareReference(ctx, o.WorkDir, o.Device, memBytes, o.Seed, o.Progress)
	if err != nil {
		return err
	}
	o.Source, o.TracePath = src, tracePath
	if o.Drift == 0 {
		return nil
	}
	// The manifest stays the one recorded from the base trace: what a
	// snapshot keeps while its guest's start-up drifts.
	o.Variants, err = synth.WriteVariants(synth.VariantOptions{MemoryBytes: memBytes, Seed: o.Seed,
		Dir: filepath.Dir(tracePath), Count: o.VariantCount() + o.LearnVariants(), Fraction: o.Drift, Progress: o.Progress})
	return err
}

// CheckPolicies checks the policy columns a run compares.
func CheckPolicies(policies []string) error {
	if len(policies) == 0 {
		return fmt.Errorf("name at least one of %s", strings.Join(restore.PolicyNames(), ", "))
	}
	for i, p := range policies {
		if err := CheckColumn(p); err != nil {
			return err
		}
		if slices.Contains(policies[:i], p) {
			// Its column would run twice and be reported once.
			return fmt.Errorf("%s is named twice", p)
		}
	}
	return nil
}

// Write prints the table, and writes the raw trials and the summary to
// jsonPath when it is set, saying so on progress.
func (r *Report) Write(out, progress io.Writer, jsonPath string) error {
	r.WriteTable(out)
	if jsonPath == "" {
		return nil
	}
	data, _ := json.MarshalIndent(r, "", "  ")
	if err := durable.WriteBytes(jsonPath, 0o644, append(data, '\n')); err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	fmt.Fprintf(progress, "wrote raw trials and summary to %s\n", jsonPath)
	return nil
}

// Target is the snapshot a run measures: a named one on the node Open
// assembles, else a fresh QEMU guest when Guest, else the reference
// snapshot.
type Target struct {
	// Snapshot is an id or alias in the node's repository; empty for a
	// prepared snapshot.
	Snapshot string
	// Open assembles the node a named snapshot restores on.
	Open func() (*node.Node, error)
	// Guest boots and captures a QEMU guest with the configuration Config
	// loads (Agent: a prebuilt guest agent, or empty to build it).
	Guest  bool
	Config func() (*config.Config, error)
	Agent  string
	// MemBytes is the reference snapshot's memory size.
	MemBytes int64
}

// RunOn runs the protocol on the target in a fresh work directory, which
// is removed afterwards, interrupted or not.
func RunOn(ctx context.Context, o Options, t Target) (_ *Report, err error) {
	work, err := os.MkdirTemp("", "warmstart-bench-")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, node.RemoveWorkDir(work)) }()
	o.WorkDir = work
	// The trials measure the operator's configuration, not the defaults.
	cfg, err := t.Config()
	if err != nil {
		return nil, err
	}
	o.Readaround = ReadaroundOf(cfg)
	if o.Progress != nil {
		fmt.Fprintln(o.Progress, o.Readaround) // first: what this run measures
	}
	switch {
	case t.Snapshot == "" && t.Guest:
		err = UseGuest(ctx, &o, cfg, t.Agent)
	case t.Snapshot == "":
		err = UseReference(ctx, &o, t.MemBytes)
	default:
		n, err := t.Open()
		if err != nil {
			return nil, err
		}
		defer n.Close()
		if o.Source, err = n.Resolve(ctx, t.Snapshot); err != nil {
			return nil, err
		}
		o.TracePath = n.Config.Replay.Trace
		if d, ok := n.Restorer.VMM.(*qemu.Driver); ok {
			o.VMM, o.QEMU = config.DriverQEMU, d.Options()
		}
	}
	if err != nil {
		return nil, err
	}
	return Run(ctx, o)
}
