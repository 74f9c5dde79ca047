package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"warmstart/internal/api"
	"warmstart/internal/layout"
	"warmstart/internal/node"
	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/repository"
	"warmstart/internal/untrusted"
)

// ImportOptions are the flags of snapshot import.
type ImportOptions struct {
	VMState, Memory, Alias, Layout string
	// LayoutFile is --layout-file: a file holding the layout (synth
	// writes one).
	LayoutFile string
	Link       bool
	// VMM restores the recording when [manifest] record_after_publish
	// is on.
	VMM VMMFlags
}

// Import is snapshot import: it publishes the snapshot opts name, in
// this process or on the daemon, and prints its id. The layout file is
// read into a copy of opts; the VMM flags are opts' own.
func (e *Env) Import(cmd *cobra.Command, opts *ImportOptions) error {
	f := *opts
	if f.VMState == "" || f.Memory == "" {
		return Error{Err: errors.New("snapshot import: --vm-state and --memory are required")}
	}
	if f.Alias != "" {
		if err := repository.ValidateNewAlias(f.Alias); err != nil {
			return Error{Err: fmt.Errorf("snapshot import: --alias: %w", err)}
		}
	}
	if err := f.readLayoutFile(); err != nil {
		return err
	}
	if e.Daemon != "" {
		return e.OnDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
			return importOn(ctx, c, o, api.ImportRequest{VMState: f.VMState, Memory: f.Memory, Alias: f.Alias, Layout: f.Layout, Link: f.Link})
		}, StoreFlag)
	}
	lay, err := importLayout(f)
	if err != nil {
		return err
	}
	return Interruptible(cmd, func(ctx context.Context) error { return e.importInProcess(ctx, cmd, f, &opts.VMM, lay) })
}

// maxLayoutFileBytes bounds --layout-file: a layout is one line.
const maxLayoutFileBytes = 64 << 10

// readLayoutFile takes --layout from the file --layout-file names. Both
// flags at once is a usage error; so is a file that cannot be read, which
// the flag named.
func (f *ImportOptions) readLayoutFile() error {
	if f.LayoutFile == "" {
		return nil
	}
	if f.Layout != "" {
		return Error{Err: errors.New("snapshot import: --layout and --layout-file: give one")}
	}
	data, err := untrusted.ReadBounded(f.LayoutFile, maxLayoutFileBytes)
	if err != nil {
		return Error{Err: fmt.Errorf("snapshot import: --layout-file: %w", err)}
	}
	f.Layout = strings.TrimSpace(string(data))
	if f.Layout == "" {
		return Error{Err: fmt.Errorf("snapshot import: --layout-file %s is empty", f.LayoutFile)}
	}
	return nil
}

// importOn publishes a snapshot on the daemon and prints its id.
func importOn(ctx context.Context, c *api.Client, o report.Output, req api.ImportRequest) error {
	rec, err := c.Import(ctx, req)
	if err != nil {
		return fmt.Errorf("snapshot import: %w", err)
	}
	if rec.Recording {
		fmt.Fprintf(o.Err, "the daemon is recording the startup manifest of %s in the background\n", rec.ID)
	}
	_, err = fmt.Fprintln(o.Out, rec.ID)
	return err
}

// importLayout is the memory layout --layout gives for the memory file,
// one region over the whole file without it.
func importLayout(f ImportOptions) (layout.Layout, error) {
	mem, err := os.Stat(f.Memory)
	if err != nil {
		return layout.Layout{}, fmt.Errorf("snapshot import: memory file: %w", err)
	}
	if !mem.Mode().IsRegular() {
		return layout.Layout{}, fmt.Errorf("snapshot import: memory file %s is not a regular file", f.Memory)
	}
	lay, err := ops.ImportLayout(f.Layout, f.Memory, mem.Size(), ops.Flags)
	var fe *ops.FieldError
	switch {
	case errors.As(err, &fe) && fe.Field == "layout":
		return lay, Error{Err: fmt.Errorf("snapshot import: %w", err)}
	case err != nil:
		return lay, fmt.Errorf("snapshot import: %w", err)
	}
	return lay, nil
}

// publishRequest is what the flags ask to publish, with progress on
// standard error.
func (f ImportOptions) publishRequest(cmd *cobra.Command, lay layout.Layout) repository.PublishRequest {
	return repository.PublishRequest{
		VMStatePath: f.VMState, MemoryPath: f.Memory, Layout: lay, Alias: f.Alias, Link: f.Link,
		Progress: report.ImportProgress(cmd.ErrOrStderr()),
	}
}

// importInProcess publishes the snapshot and prints its id. With
// [manifest] record_after_publish it then records the startup
// manifest, holding the capture lease from publish to attach, and waits
// for it.
func (e *Env) importInProcess(ctx context.Context, cmd *cobra.Command, f ImportOptions, vmm *VMMFlags, lay layout.Layout) error {
	cfg, err := e.Config()
	if err != nil {
		return err
	}
	req := f.publishRequest(cmd, lay)
	req.RecordManifest = cfg.Manifest.RecordAfterPublish
	var n *node.Node
	var repo repository.Repository
	if req.RecordManifest {
		if n, err = e.OpenNode(ctx, cmd, vmm); err == nil {
			defer n.Close()
			repo = n.Repo
		}
	} else {
		repo, err = e.OpenRepository(cmd)
	}
	if err != nil {
		return fmt.Errorf("snapshot import: %w", err)
	}
	rec, lease, err := ops.Publish(ctx, repo, req)
	if err != nil {
		return fmt.Errorf("snapshot import: %w", err)
	}
	fmt.Fprintln(cmd.OutOrStdout(), rec.ID)
	if lease == nil {
		return nil
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "recording the startup manifest of %s on the %s device; waiting for it\n", rec.ID, n.Config.Memory.Device)
	res, err := n.Recorder.Start(ctx, lease).Result()
	if err != nil {
		// The snapshot is published and restores with on-demand reads.
		return ops.NotRecorded(rec.ID, err)
	}
	report.Attached(cmd.ErrOrStderr(), rec.ID, res)
	return nil
}
