package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"warmstart/internal/repository"
)

// snapshotListCheck is `snapshot list --check`: exit 1 when the catalog
// holds damaged entries.
var snapshotListCheck bool

// printCatalog writes the rows of `snapshot list` (a table, or JSON with
// --json), warns on stderr about every damaged catalog entry, and with
// --check fails when there is any. Damaged entries are rows too, so a
// record that does not decode is never silently left out.
func printCatalog(cmd *cobra.Command, rows []repository.Entry, asJSON bool) error {
	var damaged int
	for _, row := range rows {
		if row.Corrupt != nil {
			damaged++
			fmt.Fprintf(cmd.ErrOrStderr(), "warmstart: warning: %s\n", row.Corrupt)
		}
	}
	var err error
	if asJSON {
		if rows == nil {
			rows = []repository.Entry{}
		}
		err = writeJSON(cmd.OutOrStdout(), rows)
	} else {
		err = writeCatalogTable(cmd.OutOrStdout(), rows)
	}
	if err == nil && snapshotListCheck && damaged > 0 {
		err = fmt.Errorf("snapshot list --check: %d damaged catalog entries (see the README, \"Damaged catalog entries\")", damaged)
	}
	return err
}

func writeCatalogTable(w io.Writer, rows []repository.Entry) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tALIAS\tCREATED\tMEMORY\tMANIFEST")
	for _, row := range rows {
		r := row.Record
		if row.Corrupt != nil {
			state := "CORRUPT"
			if row.Corrupt.Quarantined {
				state = "CORRUPT (quarantined)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\n", orDash(r.ID), orDash(r.Alias), state)
			continue
		}
		manifest := "no"
		if r.Manifest != nil {
			manifest = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.ID, orDash(r.Alias), r.CreatedAt.UTC().Format(time.RFC3339), sizeString(r.MemorySize), manifest)
	}
	return tw.Flush()
}
