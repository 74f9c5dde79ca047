package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/report"
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
		err = report.JSON(cmd.OutOrStdout(), rows)
	} else {
		err = report.CatalogTable(cmd.OutOrStdout(), rows)
	}
	if err == nil && snapshotListCheck && damaged > 0 {
		err = fmt.Errorf("snapshot list --check: %d damaged catalog entries (see the README, \"Damaged catalog entries\")", damaged)
	}
	return err
}
