package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/repository"
	"warmstart/internal/snapcheck"
)

// Snapshot prints `snapshot show`: the record of a snapshot, what the
// node's trusted keys make of it and where its files are (or why they
// are unavailable), as JSON or for people.
func Snapshot(w io.Writer, info api.SnapshotInfo, asJSON bool) error {
	if asJSON {
		return JSON(w, info)
	}
	rec := info.Record
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "id:\t%s\n", rec.ID)
	fmt.Fprintf(tw, "alias:\t%s\n", OrDash(rec.Alias))
	fmt.Fprintf(tw, "created:\t%s\n", rec.CreatedAt.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(tw, "vm state:\t%d bytes, sha256 %s\n", rec.VMStateSize, rec.VMStateSHA256)
	memoryLines(tw, rec)
	fmt.Fprintf(tw, "layout:\t%s (offset:size:page size; %s of the file mapped)\n", rec.Layout, Size(rec.Layout.MappedSize()))
	manifestLines(tw, rec)
	fmt.Fprintf(tw, "trust:\t%s\n", info.Trust.Line())
	if f := info.Files; f == nil {
		fmt.Fprintf(tw, "files:\tunavailable: %s\n", info.FilesError)
	} else {
		fmt.Fprintf(tw, "vm state file:\t%s\n", f.VMState)
		memoryFileLines(tw, *f)
		if f.Manifest != "" {
			fmt.Fprintf(tw, "manifest file:\t%s\n", f.Manifest)
		}
	}
	return tw.Flush()
}

// memoryFileLines print where a snapshot's memory is read from: its file,
// a layered snapshot's layer files (base first), or, in an S3 repository,
// which has no memory file, its chunks.
func memoryFileLines(tw io.Writer, f api.SnapshotFiles) {
	switch {
	case len(f.MemoryLayers) > 0:
		fmt.Fprintf(tw, "memory files:\t%d layers, base first\n", len(f.MemoryLayers))
		for i, p := range f.MemoryLayers {
			fmt.Fprintf(tw, "  layer %d file:\t%s\n", i, p)
		}
	case f.Memory == "":
		fmt.Fprintf(tw, "memory file:\tnone: read in chunks from the object store through the node cache\n")
	default:
		fmt.Fprintf(tw, "memory file:\t%s\n", f.Memory)
	}
}

// memoryLines prints the record's memory: its SHA-256, or for a paused
// snapshot its parent, depth and one line per layer of its chain.
func memoryLines(tw io.Writer, rec repository.Record) {
	if rec.Parent != "" {
		fmt.Fprintf(tw, "parent:\t%s\n", rec.Parent)
	}
	if !rec.Layered() {
		fmt.Fprintf(tw, "memory:\t%d bytes (%s), sha256 %s\n", rec.MemorySize, Size(rec.MemorySize), rec.MemorySHA256)
		return
	}
	fmt.Fprintf(tw, "memory:\t%d bytes (%s), %d layers (depth %d)\n", rec.MemorySize, Size(rec.MemorySize), len(rec.MemoryLayers), rec.Depth())
	for i, l := range rec.MemoryLayers {
		what := fmt.Sprintf("%s %s of %s, %s stored", l.Kind, l.Name, l.Snapshot, Size(l.Size))
		if p := l.PageMap; p != nil {
			what += fmt.Sprintf(", %d data + %d zero pages", p.DataPages, p.ZeroPages)
		}
		fmt.Fprintf(tw, "  layer %d:\t%s\n", i, what)
	}
}

// manifestLines prints what a record holds of its startup manifest: the
// recorded one, the startup pack, the refined manifest and its pack.
func manifestLines(tw io.Writer, rec repository.Record) {
	if m := rec.Manifest; m != nil {
		fmt.Fprintf(tw, "manifest:\tsha256 %s, %d bytes\n", m.SHA256, m.Size)
		if r := rec.ManifestRecording; r != nil {
			fmt.Fprintf(tw, "recorded from:\t%s\n", RecordingLine(*r, ""))
		}
	} else {
		fmt.Fprintf(tw, "manifest:\tnone\n")
	}
	if p := rec.StartupPack; p != nil {
		fmt.Fprintf(tw, "startup pack:\t%s\n", packLine(*p))
	}
	if d := rec.Refinement; d != nil {
		fmt.Fprintf(tw, "refined manifest:\tsha256 %s, %d pages, learned from %d restores\n", d.ManifestSHA256, d.Pages, d.Restores)
	}
	// The refined pack is what a restore streams when there is one; its
	// manifest may be an older refinement than the current one.
	if p := rec.RefinedPack; p != nil {
		fmt.Fprintf(tw, "refined pack:\t%s, built after %d restores\n", packLine(*p), p.Restores)
	}
}

// packLine describes a startup pack: its sizes, the manifest it was built
// from and its index.
func packLine(p repository.StartupPackDescriptor) string {
	return fmt.Sprintf("%s stored, %s unpacked, of manifest sha256 %s, index sha256 %s (%d bytes)",
		Size(p.StoredBytes), Size(p.LogicalBytes), p.ManifestSHA256, p.IndexSHA256, p.IndexSize)
}

// aliasMismatchMark follows the alias of a record whose alias is not
// bound to it, in the catalog table.
const aliasMismatchMark = " (ALIAS MISMATCH)"

// CatalogTable prints the rows of `snapshot list` as a table; a damaged
// entry is a row marked CORRUPT, and the alias of a record it is not
// bound to is marked ALIAS MISMATCH.
func CatalogTable(w io.Writer, rows []repository.Entry) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tALIAS\tCREATED\tMEMORY\tMANIFEST")
	for _, row := range rows {
		r := row.Record
		if row.Corrupt != nil {
			state := "CORRUPT"
			if row.Corrupt.Quarantined {
				state = "CORRUPT (quarantined)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\n", OrDash(r.ID), OrDash(r.Alias), state)
			continue
		}
		manifest := "no"
		if r.Manifest != nil {
			manifest = "yes"
		}
		alias := OrDash(r.Alias)
		if row.AliasMismatch != nil {
			alias += aliasMismatchMark
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.ID, alias, r.CreatedAt.UTC().Format(time.RFC3339), Size(r.MemorySize), manifest)
	}
	return tw.Flush()
}

// VerifyProgress prints import-style progress lines for each snapshot's
// reads, under a line naming the snapshot.
func VerifyProgress(w io.Writer) func(snapcheck.Progress) {
	var current string
	var printer func(repository.ImportProgress)
	return func(p snapcheck.Progress) {
		if p.SnapshotID != current {
			current, printer = p.SnapshotID, ImportProgress(w)
			fmt.Fprintf(w, "verifying %s\n", current)
		}
		printer(p.ImportProgress)
	}
}

// VerifyReports prints the reports and fails, so the exit status is
// 1, when any found a problem. ref is what the operator asked to verify,
// empty with --all; the error names it, since a report of a record or
// alias that did not decode has no snapshot id.
func VerifyReports(w io.Writer, reports []snapcheck.Report, asJSON bool, ref string) error {
	all := ref == ""
	var err error
	switch {
	case asJSON && all:
		err = JSON(w, reports)
	case asJSON:
		err = JSON(w, reports[0])
	case len(reports) == 0:
		_, err = fmt.Fprintln(w, "no snapshots to verify")
	}
	for i := 0; err == nil && !asJSON && i < len(reports); i++ {
		err = snapcheck.WriteText(w, reports[i])
	}
	if err != nil {
		return err
	}
	bad := 0
	for _, r := range reports {
		if !r.OK {
			bad++
		}
	}
	switch {
	case bad > 0 && !all:
		return fmt.Errorf("snapshot verify %s: problems found", ref)
	case bad > 0:
		return fmt.Errorf("snapshot verify --all: %d of %d snapshots have problems", bad, len(reports))
	}
	return nil
}

// Deleted reports a deleted snapshot.
func Deleted(w io.Writer, id, alias string) error {
	var err error
	if alias != "" {
		_, err = fmt.Fprintf(w, "deleted snapshot %s (alias %s)\n", id, alias)
	} else {
		_, err = fmt.Fprintf(w, "deleted snapshot %s\n", id)
	}
	return err
}

// Deletion reports what a delete of ref did (repository.DeleteRef).
func Deletion(w io.Writer, ref string, d repository.Deletion) error {
	switch {
	case d.Absent:
		return NothingToDelete(w, ref)
	case d.Released:
		_, err := fmt.Fprintf(w, "alias %s named snapshot %s, which no longer exists; released the alias\n", d.Alias, d.ID)
		return err
	}
	return Deleted(w, d.ID, d.Alias)
}

// NothingToDelete reports a delete of a snapshot that does not exist, by
// id or by alias.
func NothingToDelete(w io.Writer, ref string) error {
	var err error
	if repository.RefIsID(ref) {
		_, err = fmt.Fprintf(w, "snapshot %s does not exist; nothing to delete\n", ref)
	} else {
		_, err = fmt.Fprintf(w, "no snapshot has alias %s; nothing to delete\n", ref)
	}
	return err
}

// Catalog writes the rows of `snapshot list` (a table, or JSON with
// --json), warns on stderr about every damaged catalog entry and every
// alias mismatch, and with --check fails when there is any. Damaged
// entries are rows too, so a record that does not decode is never
// silently left out.
func Catalog(o Output, rows []repository.Entry, asJSON, check bool) error {
	var damaged, mismatched int
	for _, row := range rows {
		if row.Corrupt != nil {
			damaged++
			fmt.Fprintf(o.Err, "warmstart: warning: %s\n", row.Corrupt)
		}
		if row.AliasMismatch != nil {
			mismatched++
			fmt.Fprintf(o.Err, "warmstart: warning: alias mismatch: %s\n", row.AliasMismatch)
		}
	}
	var err error
	if asJSON {
		if rows == nil {
			rows = []repository.Entry{}
		}
		err = JSON(o.Out, rows)
	} else {
		err = CatalogTable(o.Out, rows)
	}
	if err == nil && check && damaged+mismatched > 0 {
		var found []string
		if damaged > 0 {
			found = append(found, fmt.Sprintf("%d damaged catalog entries", damaged))
		}
		if mismatched > 0 {
			found = append(found, fmt.Sprintf("%d alias mismatches", mismatched))
		}
		err = fmt.Errorf("snapshot list --check: %s (see the README, \"Damaged catalog entries\")", strings.Join(found, ", "))
	}
	return err
}
