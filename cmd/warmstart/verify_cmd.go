package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"warmstart/internal/api"
	"warmstart/internal/cli"
	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/snapcheck"
)

// snapshotVerifyOptions are the flags of snapshot verify.
type snapshotVerifyOptions struct {
	all, json, addDigests, cache bool
}

var snapshotVerifyFlags snapshotVerifyOptions

var snapshotVerifyCmd = &cobra.Command{
	Use:   "verify ID|ALIAS | --all [--add-digests] [--json]",
	Short: "Read every artifact of a snapshot and report bad blocks and digest mismatches",
	Long: `Read every artifact of the snapshot with that id or alias (with --all, of
every snapshot) whole and compare it with the snapshot's record:

  vm_state.bin          size and SHA-256
  memory.bin            SHA-256, and every 4 KiB block against the digest table
  memory.digests        size and SHA-256, and that it decodes (CRC-32C digests)
  memory.sha256-digests the same (SHA-256 digests)
  startup-manifest.bin  size, SHA-256 and memory layout, when one is attached
  startup pack          on S3, read whole, every frame checked, when one is stored

The memory file is read once, in 1 MiB units, whatever its size; every bad
block is reported, consecutive ones as one range. A missing, non-regular
or wrong-size artifact is reported as a problem of that artifact. Progress
goes to stderr.

An alias binding and a record that contradict each other are a problem
of kind "alias": verifying ALIAS reports a binding naming a record that
carries another alias (or none); verifying an ID, or --all, a record
carrying an alias that is bound to no snapshot or to another one.

A snapshot published before digest tables existed is reported as
"unverified (no digest table)": that alone is not a problem. --add-digests
gives such a snapshot the table computed in the same pass, but only if its
memory file matches the SHA-256 in its record; otherwise it refuses, since
the table would vouch for other bytes than the published ones. A snapshot
published before tables of SHA-256 digests existed gets one the same way
(snapshot sign needs it). A new table changes what a signature covers:
sign the snapshot again (warmstart snapshot sign) where nodes trust keys.

On a node that keeps a cache of the memory (an S3 repository's cache_dir),
the blocks of the snapshot's memory the cache holds are checked too,
against the digest table (of SHA-256 digests where the snapshot has one):
what the store holds is read past the cache, and a block this node
cached may not be the store's bytes any more (a writer of the cache dir
can keep a block's CRC-32C). A block that fails is evicted, so the next
read fetches it from the store, and reported as a problem of kind
"cache" ("cache" in JSON says what was checked). --cache=false skips it.

--json prints the report (an array of reports with --all) with snake_case
keys; "ok" says whether problems were found.

Exit status: 0 when no problem was found, 1 when one was (or the
verification itself failed), 2 for a usage error.`,
	Args: cli.Args(cli.OptionalSnapshotArg),
	RunE: runSnapshotVerify,
}

func runSnapshotVerify(cmd *cobra.Command, args []string) error {
	f := snapshotVerifyFlags
	if f.all == (len(args) == 1) {
		return usageError{Err: errors.New("snapshot verify: give one ID or ALIAS, or --all")}
	}
	if env.Daemon != "" {
		ref := strings.Join(args, "") // empty with --all
		return env.OnDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
			return verifyOn(ctx, c, o, ref, f, api.VerifyRequest{AddDigests: f.addDigests, Cache: &f.cache})
		}, cli.StoreFlag)
	}
	open := env.OpenReadOnlyRepository
	if f.addDigests {
		open = env.OpenRepository
	}
	repo, err := open(cmd)
	if err != nil {
		return fmt.Errorf("snapshot verify: %w", err)
	}
	return cli.Interruptible(cmd, func(ctx context.Context) error {
		o := cli.Output(cmd)
		opts := snapcheck.Options{AddDigests: f.addDigests, Cache: f.cache, Progress: report.VerifyProgress(o.Err)}
		if f.all {
			reports, err := ops.VerifyAll(ctx, repo, opts)
			if err != nil {
				return fmt.Errorf("snapshot verify --all: %w", err)
			}
			return report.VerifyReports(o.Out, reports, f.json, "")
		}
		ref := args[0]
		rep, err := ops.Verify(ctx, repo, ref, opts)
		if err != nil {
			return cli.RefError("snapshot verify", ref, err)
		}
		return report.VerifyReports(o.Out, []snapcheck.Report{rep}, f.json, ref)
	})
}

// verifyOn verifies one snapshot on the daemon, or with --all every
// snapshot it lists, and prints the reports; it fails when any found a
// problem.
func verifyOn(ctx context.Context, c *api.Client, o report.Output, ref string, f snapshotVerifyOptions, req api.VerifyRequest) error {
	if !f.all {
		rep, err := c.VerifySnapshot(ctx, ref, req)
		if err != nil {
			return fmt.Errorf("snapshot verify %s: %w", ref, err)
		}
		return report.VerifyReports(o.Out, []snapcheck.Report{rep}, f.json, ref)
	}
	reports, err := c.VerifyAll(ctx, req, func(id string) { fmt.Fprintf(o.Err, "verifying %s on the daemon\n", id) })
	if err != nil {
		return fmt.Errorf("snapshot verify --all: %w", err)
	}
	return report.VerifyReports(o.Out, reports, f.json, "")
}

func init() {
	fl := snapshotVerifyCmd.Flags()
	fl.BoolVar(&snapshotVerifyFlags.all, "all", false, "verify every snapshot")
	fl.BoolVar(&snapshotVerifyFlags.json, "json", false, "print JSON")
	fl.BoolVar(&snapshotVerifyFlags.cache, "cache", true,
		"also check what this node's cache holds of the memory (S3), evicting blocks that fail; --cache=false skips it")
	fl.BoolVar(&snapshotVerifyFlags.addDigests, "add-digests", false,
		"give a snapshot without a SHA-256 digest table one, if its memory matches its record")
	snapshotCmd.AddCommand(snapshotVerifyCmd)
}
