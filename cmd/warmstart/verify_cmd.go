package main

import (
	"github.com/spf13/cobra"

	"warmstart/internal/cli"
)

var snapshotVerifyFlags cli.VerifyOptions

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
	RunE: func(cmd *cobra.Command, args []string) error { return env.Verify(cmd, args, snapshotVerifyFlags) },
}

func init() {
	fl := snapshotVerifyCmd.Flags()
	fl.BoolVar(&snapshotVerifyFlags.All, "all", false, "verify every snapshot")
	fl.BoolVar(&snapshotVerifyFlags.JSON, "json", false, "print JSON")
	fl.BoolVar(&snapshotVerifyFlags.Cache, "cache", true,
		"also check what this node's cache holds of the memory (S3), evicting blocks that fail; --cache=false skips it")
	fl.BoolVar(&snapshotVerifyFlags.AddDigests, "add-digests", false,
		"give a snapshot without a SHA-256 digest table one, if its memory matches its record")
	snapshotCmd.AddCommand(snapshotVerifyCmd)
}
