// Package remote runs the CLI's verbs on a daemon through its client and
// prints what the same verbs print in process (package report), so a
// --daemon run and an in-process run read alike. Errors name the verb; a
// request the daemon refused as malformed keeps its *daemon.APIError (status
// 400) in the chain, so the caller can report it as a usage error.
package remote

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"warmstart/internal/config"
	"warmstart/internal/daemon"
	"warmstart/internal/report"
	"warmstart/internal/repository"
	"warmstart/internal/snapcheck"
)

// Dial returns a client for the daemon at socket: a Unix socket, or
// http(s)://host:port, which needs the API token (see Token).
func Dial(socket string, loadConfig func() (*config.Config, error)) (*daemon.Client, error) {
	web := strings.HasPrefix(socket, "http://") || strings.HasPrefix(socket, "https://")
	if !web && strings.Contains(socket, "://") {
		// Not a path anyone means: dialled as a socket, it would fail as
		// a missing file.
		return nil, fmt.Errorf("%q: want the path of a Unix socket or http(s)://host:port", socket)
	}
	c := daemon.NewClient(socket)
	if !web {
		return c, nil // the socket is mode 0600: reaching it is authentication
	}
	token, err := Token(loadConfig)
	if err != nil {
		return nil, err
	}
	return c.WithToken(token), nil
}

// Token is the bearer token for a daemon serving TCP: WARMSTART_TOKEN,
// else the token file the configuration names ([daemon] token_file).
func Token(loadConfig func() (*config.Config, error)) (string, error) {
	if t := strings.TrimSpace(os.Getenv("WARMSTART_TOKEN")); t != "" {
		return t, nil
	}
	cfg, err := loadConfig()
	if err != nil {
		return "", err
	}
	token, err := daemon.ReadToken(cfg.DaemonTokenFile())
	if err != nil {
		return "", fmt.Errorf("no API token: set WARMSTART_TOKEN or make %s readable: %w", cfg.DaemonTokenFile(), err)
	}
	return token, nil
}

// Import publishes a snapshot on the daemon and prints its id. The daemon
// opens the files itself, so they are named absolutely.
func Import(ctx context.Context, c *daemon.Client, o report.Output, req daemon.ImportRequest) error {
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
func Show(ctx context.Context, c *daemon.Client, o report.Output, ref string, asJSON bool) error {
	info, err := c.Snapshot(ctx, ref)
	if err != nil {
		return fmt.Errorf("snapshot show %s: %w", ref, err)
	}
	var (
		res    repository.Resolved
		resErr error
		files  *report.SnapshotFiles
	)
	if info.Files != nil {
		res = repository.Resolved{Record: info.Record, VMStatePath: info.Files.VMState, MemoryPath: info.Files.Memory, ManifestPath: info.Files.Manifest}
		files = &report.SnapshotFiles{VMState: info.Files.VMState, Memory: info.Files.Memory, Manifest: info.Files.Manifest}
	} else {
		resErr = errors.New(info.FilesError)
	}
	if asJSON {
		return report.JSON(o.Out, report.SnapshotShow{Record: info.Record, Files: files, Trust: info.Trust})
	}
	return report.SnapshotText(o.Out, info.Record, info.Trust, res, resErr)
}

// Delete deletes a snapshot on the daemon; one that does not exist is
// reported, not an error.
func Delete(ctx context.Context, c *daemon.Client, o report.Output, ref string) error {
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
func RecordManifest(ctx context.Context, c *daemon.Client, o report.Output, ref string) error {
	fmt.Fprintf(o.Err, "recording %s on the daemon...\n", ref)
	res, err := c.RecordManifest(ctx, ref)
	if err != nil {
		return fmt.Errorf("record-manifest %s: %w", ref, err)
	}
	return report.Recorded(o.Out, res)
}

// Verify verifies one snapshot on the daemon, or with all every snapshot
// it lists, and prints the reports; it fails when any found a problem.
func Verify(ctx context.Context, c *daemon.Client, o report.Output, ref string, all, asJSON bool, req daemon.VerifyRequest) error {
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
func List(ctx context.Context, c *daemon.Client, o report.Output, f repository.Filter, asJSON, check bool) error {
	rows, err := c.Catalog(ctx, f)
	if err != nil {
		return fmt.Errorf("snapshot list: %w", err)
	}
	return report.Catalog(o, rows, asJSON, check)
}
