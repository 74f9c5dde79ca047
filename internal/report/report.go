// Package report renders what the verbs print: restores, snapshots, the
// catalog, startup manifests, captures and verification results, as text
// for people and as JSON. A verb prints through it whether it ran in
// process or on a daemon, so both paths print the same thing.
package report

import (
	"encoding/json"
	"fmt"
	"io"

	"warmstart/internal/repository"
)

// Output is where a verb prints: results on Out, progress and notes on Err.
type Output struct{ Out, Err io.Writer }

// importProgressSteps is how many progress lines import prints per artifact
// and step (one per quarter).
const importProgressSteps = 4

// ImportProgress reports each artifact's import steps on w, a line per
// quarter done.
func ImportProgress(w io.Writer) func(repository.ImportProgress) {
	type key struct{ artifact, step string }
	printed := map[key]int{}
	return func(p repository.ImportProgress) {
		quarter := importProgressSteps
		if p.TotalBytes > 0 {
			quarter = int(p.DoneBytes * importProgressSteps / p.TotalBytes)
		}
		k := key{p.Artifact, p.Step}
		if last, seen := printed[k]; seen && quarter <= last {
			return
		}
		printed[k] = quarter
		if quarter == 0 {
			return
		}
		fmt.Fprintf(w, "%s: %s %s of %s\n", p.Artifact, p.Step, Size(p.DoneBytes), Size(p.TotalBytes))
	}
}

// JSON writes v as indented JSON, the form every --json output takes.
func JSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Size renders a byte count for people: "3000 B", "8.0 MiB".
func Size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	value, exp := float64(n)/unit, 0
	for value >= unit && exp < 4 {
		value /= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", value, "KMGTP"[exp])
}

// OrDash is s, or "-" for an empty field in a table.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
