package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/api"
	"warmstart/internal/cli"
	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/repository"
)

var snapshotCmd = &cobra.Command{
	Use:   "snapshot",
	Short: "Import, list, show, verify and delete snapshots in the repository",
	Long: `A snapshot is what a paused microVM leaves behind: the VMM state file and the
guest memory file, plus the memory layout (regions of the memory file mapped
into the guest) and, once recorded, its startup manifest. The repository
named by the configuration ([snapshot] repository_backend and
[backend.posix_fs] snapshot_store) keeps them under a UUIDv7 id and an
optional alias ([A-Za-z0-9_-], 1 to 128 characters).

--store DIR uses the POSIX store in DIR instead of the configured one.`,
}

var snapshotImportFlags cli.ImportOptions

var snapshotImportCmd = &cobra.Command{
	Use:   "import --vm-state FILE --memory FILE [--alias NAME] [--layout SPEC | --layout-file FILE] [--link]",
	Short: "Publish a snapshot from a VM state file and a memory file; print its id",
	Long: `Publish the VMM state file and guest memory file as a new snapshot and print
its id on stdout. Progress (copying, hashing) goes to stderr.

The files are copied, so later writes to them never change the snapshot:
reflinked where the file system shares extents (btrfs, XFS), otherwise
copied byte by byte and the copy's SHA-256 checked after it reached the
disk. The same pass computes the memory file's per-block digest table,
which every restore checks the memory against before serving it.

--link hard-links the files into the store instead (same file system
only) and makes them read-only (takes their write bits away, and
nothing else: a private file stays private). The source files then ARE the
snapshot: never write them again, or the published snapshot changes (its
digests catch that on restore, and the restore fails).

--layout gives the guest memory regions as comma-separated
offset:size[:pagesize] in bytes (suffixes K, M, G, KiB, MiB, GiB), e.g.
"0:2GiB,3GiB:1GiB:2MiB". Without it one region covers the whole file.
--layout-file reads the same from a file, such as the layout file
warmstart synth writes.

--alias binds a name to the snapshot; it fails if another snapshot holds it.

With [manifest] record_after_publish = true the startup manifest is
then recorded, as a daemon does after an import, holding the capture lease;
this command waits for it (progress on standard error) with the VMM that
[vmm] driver, [replay] trace, --vmm and --trace name.`,
	Args: cli.Args(cobra.NoArgs),
	RunE: func(cmd *cobra.Command, _ []string) error { return env.Import(cmd, &snapshotImportFlags) },
}

// snapshotListCheck is `snapshot list --check`: exit 1 when the catalog
// holds damaged entries.
var snapshotListCheck bool

var snapshotListFlags struct {
	json        bool
	aliasPrefix string
}

var snapshotListCmd = &cobra.Command{
	Use:   "list [--json] [--alias-prefix PREFIX] [--check]",
	Short: "List snapshots, oldest first",
	Long: `List the snapshots in the repository, oldest first, as a table of id, alias,
creation time, memory size and whether a startup manifest is attached; with
--json, as a JSON array of records. --alias-prefix keeps only snapshots whose
alias starts with PREFIX.

A catalog entry that does not decode (a record or an alias binding) is a row
marked CORRUPT (in JSON: {"id" or "alias", "corrupt": {...}}) and a warning
on stderr. A record whose alias is bound to no snapshot, or to another one,
has its alias marked (ALIAS MISMATCH) (in JSON: "alias_mismatch": {...})
and a warning. With --check the command exits 1 when there is either.
Listing never changes the store: writers move damaged entries to
catalog/quarantine/.`,
	Args: cli.Args(cobra.NoArgs),
	RunE: func(cmd *cobra.Command, _ []string) error {
		f := repository.Filter{AliasPrefix: snapshotListFlags.aliasPrefix}
		if err := repository.ValidateFilter(f); err != nil {
			return usageError{Err: fmt.Errorf("snapshot list: --alias-prefix: %w", err)}
		}
		if env.Daemon != "" {
			return env.OnDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
				rows, err := c.Catalog(ctx, f)
				if err != nil {
					return fmt.Errorf("snapshot list: %w", err)
				}
				return report.Catalog(o, rows, snapshotListFlags.json, snapshotListCheck)
			}, cli.StoreFlag)
		}
		repo, err := env.OpenReadOnlyRepository(cmd)
		if err != nil {
			return fmt.Errorf("snapshot list: %w", err)
		}
		rows, _, err := ops.List(cmd.Context(), repo, f)
		if err != nil {
			return fmt.Errorf("snapshot list: %w", err)
		}
		return report.Catalog(cli.Output(cmd), rows, snapshotListFlags.json, snapshotListCheck)
	},
}

var snapshotShowJSON bool

var snapshotShowCmd = &cobra.Command{
	Use:   "show ID|ALIAS [--json]",
	Short: "Print one snapshot's record, manifest descriptor included",
	Long: `Print the record of the snapshot with that id or alias: sizes and SHA-256
digests of its files, its memory layout, the descriptor (SHA-256, size) of
its startup manifest when one is attached, its refined manifest when
restores have refined it, the startup pack and the refined pack (sizes,
manifest, index; S3 only) when stored, and where its files are. With
--json the record's fields (startup_pack, refined_pack and signatures
among them), "files" and "trust". An argument that parses as a UUID is
taken as an id, anything else as an alias.

"trust" is what this node's [trust] trusted_keys make of the record's
signatures: "verified" (signed by a trusted key: it names the key),
"refused" (restores here fail, exit 3, and it says why: unsigned, signed
by keys not trusted here, or changed after it was signed) or "unverified"
(the node trusts no key and checks none); either way it lists the keys
whose signatures verify and those whose no longer do.`,
	Args: cli.Args(cli.SnapshotArg),
	RunE: func(cmd *cobra.Command, args []string) error {
		ref := args[0]
		if env.Daemon != "" {
			return env.OnDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
				info, err := c.Snapshot(ctx, ref)
				if err != nil {
					return fmt.Errorf("snapshot show %s: %w", ref, err)
				}
				return report.Snapshot(o.Out, info, snapshotShowJSON)
			}, cli.StoreFlag)
		}
		repo, err := env.OpenReadOnlyRepository(cmd)
		if err != nil {
			return fmt.Errorf("snapshot show: %w", err)
		}
		policy, err := env.TrustPolicy()
		if err != nil {
			return fmt.Errorf("snapshot show: %w", err)
		}
		info, err := ops.Show(cmd.Context(), repo, policy, ref)
		if err != nil {
			return cli.RefError("snapshot show", ref, err)
		}
		return report.Snapshot(cmd.OutOrStdout(), info, snapshotShowJSON)
	},
}

var snapshotDeleteCmd = &cobra.Command{
	Use:   "delete ID|ALIAS",
	Short: "Delete a snapshot: its record, alias and files",
	Long: `Delete the snapshot with that id or alias: its record, its alias binding and
its files. Deleting a snapshot that does not exist succeeds and says so; a
delete that was interrupted is finished by running it again. An alias that
names a snapshot which no longer exists is released, and the verb says so.`,
	Args: cli.Args(cli.SnapshotArg),
	RunE: func(cmd *cobra.Command, args []string) error {
		ref := args[0]
		if env.Daemon != "" {
			return env.OnDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
				del, err := c.DeleteSnapshot(ctx, ref)
				switch {
				case errors.Is(err, repository.ErrNotFound):
					return report.NothingToDelete(o.Out, ref)
				case err != nil:
					return fmt.Errorf("snapshot delete %s: %w", ref, err)
				}
				return report.Deletion(o.Out, ref, repository.Deletion{ID: del.ID, Alias: del.Alias, Released: del.Released})
			}, cli.StoreFlag)
		}
		repo, err := env.OpenRepository(cmd)
		if err != nil {
			return fmt.Errorf("snapshot delete: %w", err)
		}
		del, err := ops.Delete(cmd.Context(), repo, ref)
		if err != nil {
			return cli.RefError("snapshot delete", ref, err)
		}
		return report.Deletion(cmd.OutOrStdout(), ref, del)
	},
}

func init() {
	snapshotCmd.PersistentFlags().String(cli.StoreFlag, "", "POSIX snapshot store directory (overrides the configuration)")

	fl := snapshotImportCmd.Flags()
	fl.StringVar(&snapshotImportFlags.VMState, "vm-state", "", "VMM state file of the snapshot (required)")
	fl.StringVar(&snapshotImportFlags.Memory, "memory", "", "guest memory file of the snapshot (required)")
	fl.StringVar(&snapshotImportFlags.Alias, "alias", "", "name to bind to the snapshot")
	fl.StringVar(&snapshotImportFlags.Layout, "layout", "", "memory regions offset:size[:pagesize],... (default: one region over the whole file)")
	fl.StringVar(&snapshotImportFlags.LayoutFile, "layout-file", "", "file holding --layout's SPEC, such as the layout file synth writes")
	snapshotImportFlags.VMM.Register(snapshotImportCmd)
	fl.BoolVar(&snapshotImportFlags.Link, "link", false, "hard-link the files instead of copying them and make them read-only; never write them again")

	snapshotListCmd.Flags().BoolVar(&snapshotListFlags.json, "json", false, "print JSON")
	snapshotListCmd.Flags().BoolVar(&snapshotListCheck, "check", false, "exit 1 when the catalog holds damaged entries")
	snapshotListCmd.Flags().StringVar(&snapshotListFlags.aliasPrefix, "alias-prefix", "", "only snapshots whose alias starts with this")
	snapshotShowCmd.Flags().BoolVar(&snapshotShowJSON, "json", false, "print JSON")

	snapshotCmd.AddCommand(snapshotImportCmd, snapshotListCmd, snapshotShowCmd, snapshotDeleteCmd)
	env.AddDaemonFlag(snapshotCmd)
	rootCmd.AddCommand(snapshotCmd)
}
