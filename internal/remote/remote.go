// Package remote runs the CLI's verbs on a daemon through its client and
// prints what the same verbs print in process (package report), so a
// --daemon run and an in-process run read alike. Errors name the verb; a
// request the daemon refused as malformed keeps its *api.APIError (status
// 400) in the chain, so the caller can report it as a usage error.
package remote

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"warmstart/internal/api"
	"warmstart/internal/report"
	"warmstart/internal/repository"
	"warmstart/internal/snapcheck"
)

// Import publishes a snapshot on the daemon and prints its id. The daemon
// opens the files itself, so they are named absolutely.
func Import(ctx context.Context, c *api.Client, o report.Output, req api.ImportRequest) error {
	var err error
	if req.VMState, err = filepath.Abs(req.VMState); err != nil {
		return err
	}
	if req.Memory, err = filepath.Abs(req.Memory); err != nil {
		return err
	}
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

// Show prints a snapshot's record and files as the daemon reports them.
func Show(ctx context.Context, c *api.Client, o report.Output, ref string, asJSON bool) error {
	info, err := c.Snapshot(ctx, ref)
	if err != nil {
		return fmt.Errorf("snapshot show %s: %w", ref, err)
	}
	return report.Snapshot(o.Out, info, asJSON)
}

// Delete deletes a snapshot on the daemon; one that does not exist is
// reported, not an error.
func Delete(ctx context.Context, c *api.Client, o report.Output, ref string) error {
	del, err := c.DeleteSnapshot(ctx, ref)
	switch {
	case errors.Is(err, repository.ErrNotFound):
		return report.NothingToDelete(o.Out, ref)
	case err != nil:
		return fmt.Errorf("snapshot delete %s: %w", ref, err)
	}
	return report.Deletion(o.Out, ref, repository.Deletion{ID: del.ID, Alias: del.Alias, Released: del.Released})
}

// RecordManifest records a snapshot's startup manifest on the daemon and
// waits for it.
func RecordManifest(ctx context.Context, c *api.Client, o report.Output, ref string) error {
	fmt.Fprintf(o.Err, "recording %s on the daemon...\n", ref)
	res, err := c.RecordManifest(ctx, ref)
	if err != nil {
		return fmt.Errorf("record-manifest %s: %w", ref, err)
	}
	return report.Recorded(o.Out, res)
}

// Verify verifies one snapshot on the daemon, or with all every snapshot
// it lists, and prints the reports; it fails when any found a problem.
func Verify(ctx context.Context, c *api.Client, o report.Output, ref string, all, asJSON bool, req api.VerifyRequest) error {
	if !all {
		rep, err := c.VerifySnapshot(ctx, ref, req)
		if err != nil {
			return fmt.Errorf("snapshot verify %s: %w", ref, err)
		}
		return report.VerifyReports(o.Out, []snapcheck.Report{rep}, asJSON, ref)
	}
	// The catalog, not the snapshot list: damaged entries are reported
	// too, as snapcheck.VerifyAll does in process.
	rows, err := c.Catalog(ctx, repository.Filter{})
	if err != nil {
		return fmt.Errorf("snapshot verify --all: %w", err)
	}
	reports := make([]snapcheck.Report, 0, len(rows))
	var damaged []snapcheck.Report
	for _, rec := range rows {
		if rec.Corrupt != nil {
			damaged = append(damaged, snapcheck.DamagedEntry(*rec.Corrupt))
			continue
		}
		fmt.Fprintf(o.Err, "verifying %s on the daemon\n", rec.ID)
		rep, err := c.VerifySnapshot(ctx, rec.ID, req)
		if errors.Is(err, repository.ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return fmt.Errorf("snapshot verify %s: %w", rec.ID, err)
		}
		reports = append(reports, rep)
	}
	return report.VerifyReports(o.Out, append(reports, damaged...), asJSON, "")
}

// List prints the daemon's catalog filter f selects (see report.Catalog).
func List(ctx context.Context, c *api.Client, o report.Output, f repository.Filter, asJSON, check bool) error {
	rows, err := c.Catalog(ctx, f)
	if err != nil {
		return fmt.Errorf("snapshot list: %w", err)
	}
	return report.Catalog(o, rows, asJSON, check)
}
