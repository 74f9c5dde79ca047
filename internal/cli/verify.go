package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"warmstart/internal/api"
	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/snapcheck"
)

// VerifyOptions are the flags of snapshot verify.
type VerifyOptions struct {
	All, JSON, AddDigests, Cache bool
}

// Verify is snapshot verify: it verifies the snapshot args name, or with
// --all every snapshot, in this process or on the daemon, and prints the
// reports.
func (e *Env) Verify(cmd *cobra.Command, args []string, f VerifyOptions) error {
	if f.All == (len(args) == 1) {
		return Error{Err: errors.New("snapshot verify: give one ID or ALIAS, or --all")}
	}
	if e.Daemon != "" {
		ref := strings.Join(args, "") // empty with --all
		return e.OnDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
			return verifyOn(ctx, c, o, ref, f, api.VerifyRequest{AddDigests: f.AddDigests, Cache: &f.Cache})
		}, StoreFlag)
	}
	open := e.OpenReadOnlyRepository
	if f.AddDigests {
		open = e.OpenRepository
	}
	repo, err := open(cmd)
	if err != nil {
		return fmt.Errorf("snapshot verify: %w", err)
	}
	policy, err := e.TrustPolicy()
	if err != nil {
		return fmt.Errorf("snapshot verify: %w", err)
	}
	return Interruptible(cmd, func(ctx context.Context) error {
		o := Output(cmd)
		opts := snapcheck.Options{AddDigests: f.AddDigests, Cache: f.Cache, Trust: policy, Progress: report.VerifyProgress(o.Err)}
		if f.All {
			reports, err := ops.VerifyAll(ctx, repo, opts)
			if err != nil {
				return fmt.Errorf("snapshot verify --all: %w", err)
			}
			return report.VerifyReports(o.Out, reports, f.JSON, "")
		}
		ref := args[0]
		rep, err := ops.Verify(ctx, repo, ref, opts)
		if err != nil {
			return RefError("snapshot verify", ref, err)
		}
		return report.VerifyReports(o.Out, []snapcheck.Report{rep}, f.JSON, ref)
	})
}

// verifyOn verifies one snapshot on the daemon, or with --all every
// snapshot it lists, and prints the reports; it fails when any found a
// problem.
func verifyOn(ctx context.Context, c *api.Client, o report.Output, ref string, f VerifyOptions, req api.VerifyRequest) error {
	if !f.All {
		rep, err := c.VerifySnapshot(ctx, ref, req)
		if err != nil {
			return fmt.Errorf("snapshot verify %s: %w", ref, err)
		}
		return report.VerifyReports(o.Out, []snapcheck.Report{rep}, f.JSON, ref)
	}
	reports, err := c.VerifyAll(ctx, req, func(id string) { fmt.Fprintf(o.Err, "verifying %s on the daemon\n", id) })
	if err != nil {
		return fmt.Errorf("snapshot verify --all: %w", err)
	}
	return report.VerifyReports(o.Out, reports, f.JSON, "")
}
