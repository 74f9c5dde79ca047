package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"warmstart/internal/api"
	"warmstart/internal/layout"
	"warmstart/internal/local"
	"warmstart/internal/ops"
	"warmstart/internal/remote"
	"warmstart/internal/report"
	"warmstart/internal/repository"
	"warmstart/internal/usage"
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

// snapshotImportOptions are the flags of snapshot import.
type snapshotImportOptions struct {
	vmState, memory, alias, layout string
	link                           bool
	// vmm restores the recording when [snapshot.memory_startup_pack]
	// enabled is on.
	vmm vmmFlags
}

var snapshotImportFlags snapshotImportOptions

var snapshotImportCmd = &cobra.Command{
	Use:   "import --vm-state FILE --memory FILE [--alias NAME] [--layout SPEC] [--link]",
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

--alias binds a name to the snapshot; it fails if another snapshot holds it.

With [snapshot.memory_startup_pack] enabled = true the startup manifest is
then recorded, as a daemon does after an import, holding the capture lease;
this command waits for it (progress on standard error) with the VMM that
[vmm] driver, [replay] trace, --vmm and --trace name.`,
	Args: usage.Args(cobra.NoArgs),
	RunE: runSnapshotImport,
}

func runSnapshotImport(cmd *cobra.Command, _ []string) error {
	f := snapshotImportFlags
	if f.vmState == "" || f.memory == "" {
		return usageError{Err: errors.New("snapshot import: --vm-state and --memory are required")}
	}
	if f.alias != "" {
		if err := repository.ValidateAlias(f.alias); err != nil {
			return usageError{Err: fmt.Errorf("snapshot import: --alias: %w", err)}
		}
	}
	if daemonSocket != "" {
		return onDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
			return remote.Import(ctx, c, o, api.ImportRequest{VMState: f.vmState, Memory: f.memory, Alias: f.alias, Layout: f.layout, Link: f.link})
		}, storeFlag)
	}
	lay, err := importLayout(f)
	if err != nil {
		return err
	}
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	if cfg.Snapshot.MemoryStartupPack.Enabled {
		return interruptible(cmd, func(ctx context.Context) error { return importAndRecord(ctx, cmd, f, lay) })
	}
	repo, err := openRepository(cmd)
	if err != nil {
		return fmt.Errorf("snapshot import: %w", err)
	}
	return interruptible(cmd, func(ctx context.Context) error {
		rec, _, err := ops.Publish(ctx, repo, f.publishRequest(cmd, lay))
		if err != nil {
			return fmt.Errorf("snapshot import: %w", err)
		}
		_, err = fmt.Fprintln(cmd.OutOrStdout(), rec.ID)
		return err
	})
}

// importLayout is the memory layout --layout gives for the memory file,
// one region over the whole file without it.
func importLayout(f snapshotImportOptions) (layout.Layout, error) {
	mem, err := os.Stat(f.memory)
	if err != nil {
		return layout.Layout{}, fmt.Errorf("snapshot import: memory file: %w", err)
	}
	if !mem.Mode().IsRegular() {
		return layout.Layout{}, fmt.Errorf("snapshot import: memory file %s is not a regular file", f.memory)
	}
	lay, err := ops.ImportLayout(f.layout, f.memory, mem.Size(), ops.Flags)
	var fe *ops.FieldError
	switch {
	case errors.As(err, &fe) && fe.Field == "layout":
		return lay, usageError{Err: fmt.Errorf("snapshot import: %w", err)}
	case err != nil:
		return lay, fmt.Errorf("snapshot import: %w", err)
	}
	return lay, nil
}

// publishRequest is what the flags ask to publish, with progress on
// standard error.
func (f snapshotImportOptions) publishRequest(cmd *cobra.Command, lay layout.Layout) repository.PublishRequest {
	return repository.PublishRequest{
		VMStatePath: f.vmState, MemoryPath: f.memory, Layout: lay, Alias: f.alias, Link: f.link,
		Progress: report.ImportProgress(cmd.ErrOrStderr()),
	}
}

// importAndRecord publishes the snapshot and records its startup manifest,
// holding the capture lease from publish to attach, and waits for it.
func importAndRecord(ctx context.Context, cmd *cobra.Command, f snapshotImportOptions, lay layout.Layout) error {
	n, err := openSystem(cmd, &snapshotImportFlags.vmm)
	if err != nil {
		return fmt.Errorf("snapshot import: %w", err)
	}
	defer n.Close()
	return local.ImportAndRecord(ctx, n, cmdOutput(cmd), f.publishRequest(cmd, lay))
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
	Args: usage.Args(cobra.NoArgs),
	RunE: func(cmd *cobra.Command, _ []string) error {
		f := repository.Filter{AliasPrefix: snapshotListFlags.aliasPrefix}
		if err := repository.ValidateFilter(f); err != nil {
			return usageError{Err: fmt.Errorf("snapshot list: --alias-prefix: %w", err)}
		}
		if daemonSocket != "" {
			return onDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
				return remote.List(ctx, c, o, f, snapshotListFlags.json, snapshotListCheck)
			}, storeFlag)
		}
		repo, err := openReadOnlyRepository(cmd)
		if err != nil {
			return fmt.Errorf("snapshot list: %w", err)
		}
		return local.List(cmd.Context(), repo, cmdOutput(cmd), f, snapshotListFlags.json, snapshotListCheck)
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
	Args: usage.Args(snapshotArg),
	RunE: func(cmd *cobra.Command, args []string) error {
		ref := args[0]
		if daemonSocket != "" {
			return onDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
				return remote.Show(ctx, c, o, ref, snapshotShowJSON)
			}, storeFlag)
		}
		repo, err := openReadOnlyRepository(cmd)
		if err != nil {
			return fmt.Errorf("snapshot show: %w", err)
		}
		policy, err := trustPolicy()
		if err != nil {
			return fmt.Errorf("snapshot show: %w", err)
		}
		return invalidAsUsage(local.Show(cmd.Context(), repo, policy, cmdOutput(cmd), ref, snapshotShowJSON))
	},
}

var snapshotDeleteCmd = &cobra.Command{
	Use:   "delete ID|ALIAS",
	Short: "Delete a snapshot: its record, alias and files",
	Long: `Delete the snapshot with that id or alias: its record, its alias binding and
its files. Deleting a snapshot that does not exist succeeds and says so; a
delete that was interrupted is finished by running it again. An alias that
names a snapshot which no longer exists is released, and the verb says so.`,
	Args: usage.Args(snapshotArg),
	RunE: func(cmd *cobra.Command, args []string) error {
		ref := args[0]
		if daemonSocket != "" {
			return onDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
				return remote.Delete(ctx, c, o, ref)
			}, storeFlag)
		}
		repo, err := openRepository(cmd)
		if err != nil {
			return fmt.Errorf("snapshot delete: %w", err)
		}
		return invalidAsUsage(local.Delete(cmd.Context(), repo, cmdOutput(cmd), ref))
	},
}

// refError names the snapshot a verb failed on (local.RefError); a
// malformed id or alias is a usage error.
func refError(verb, ref string, err error) error {
	return invalidAsUsage(local.RefError(verb, ref, err))
}

// invalidAsUsage makes a malformed id or alias a usage error.
func invalidAsUsage(err error) error {
	if errors.Is(err, repository.ErrInvalidRequest) {
		return usageError{Err: err}
	}
	return err
}

// cmdOutput is where cmd prints.
func cmdOutput(cmd *cobra.Command) report.Output {
	return report.Output{Out: cmd.OutOrStdout(), Err: cmd.ErrOrStderr()}
}

func init() {
	snapshotCmd.PersistentFlags().String(storeFlag, "", "POSIX snapshot store directory (overrides the configuration)")

	fl := snapshotImportCmd.Flags()
	fl.StringVar(&snapshotImportFlags.vmState, "vm-state", "", "VMM state file of the snapshot (required)")
	fl.StringVar(&snapshotImportFlags.memory, "memory", "", "guest memory file of the snapshot (required)")
	fl.StringVar(&snapshotImportFlags.alias, "alias", "", "name to bind to the snapshot")
	fl.StringVar(&snapshotImportFlags.layout, "layout", "", "memory regions offset:size[:pagesize],... (default: one region over the whole file)")
	snapshotImportFlags.vmm.register(snapshotImportCmd)
	fl.BoolVar(&snapshotImportFlags.link, "link", false, "hard-link the files instead of copying them and make them read-only; never write them again")

	snapshotListCmd.Flags().BoolVar(&snapshotListFlags.json, "json", false, "print JSON")
	snapshotListCmd.Flags().BoolVar(&snapshotListCheck, "check", false, "exit 1 when the catalog holds damaged entries")
	snapshotListCmd.Flags().StringVar(&snapshotListFlags.aliasPrefix, "alias-prefix", "", "only snapshots whose alias starts with this")
	snapshotShowCmd.Flags().BoolVar(&snapshotShowJSON, "json", false, "print JSON")

	snapshotCmd.AddCommand(snapshotImportCmd, snapshotListCmd, snapshotShowCmd, snapshotDeleteCmd)
	addDaemonFlag(snapshotCmd)
	rootCmd.AddCommand(snapshotCmd)
}
