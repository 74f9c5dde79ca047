package repository

import (
	"fmt"
	"math"
)

// Recording says how the attached startup manifest was recorded: from how
// many traced restores, and how much two of them agreed. It lives in the
// record (manifest_recording: "recording" already says, in an import's
// answer, that a recording runs) next to the manifest's descriptor because it describes those
// bytes: it is written with the descriptor, under the same record lock,
// and dropped with it, so it never speaks of another manifest; and
// `snapshot show` (which reads only the record) can tell an operator that
// a guest's start-up drifts without recording it again.
type Recording struct {
	// Runs is how many traced restores the manifest's pages come from: 2
	// when it holds the pages both touched, 1 when it is one run's.
	Runs int `json:"runs"`
	// Overlap is |A ∩ B| / |A ∪ B| of the pages two runs touched; absent
	// when only one run ended.
	Overlap *float64 `json:"overlap,omitempty"`
	// RankCorrelation is Spearman's rho of the two runs' first-touch
	// orders over their common pages; absent when undefined (fewer than
	// two common pages) or when only one run ended.
	RankCorrelation *float64 `json:"rank_correlation,omitempty"`
	// Harvested, when set, says the manifest was not recorded by traced
	// restores but harvested from a running restore at a pause; Runs is
	// then 0.
	Harvested *Harvest `json:"harvested,omitempty"`
}

// Harvest says where a harvested manifest's pages came from.
type Harvest struct {
	// FromRestore is the restore that was paused.
	FromRestore string `json:"from_restore"`
	// StartupPages were on its path to ready, WrittenPages written since,
	// LaterPages touched after ready.
	StartupPages int64 `json:"startup_pages"`
	WrittenPages int64 `json:"written_pages"`
	LaterPages   int64 `json:"later_pages"`
}

// MaxRecordingRuns is the most traced restores a recording makes.
const MaxRecordingRuns = 2

// Validate checks a recording read back from a record.
func (r Recording) Validate() error {
	if h := r.Harvested; h != nil {
		if r.Runs != 0 || r.Overlap != nil || r.RankCorrelation != nil || h.FromRestore == "" ||
			h.StartupPages < 0 || h.WrittenPages < 0 || h.LaterPages < 0 {
			return fmt.Errorf("harvested recording has runs %d or a malformed origin or page count", r.Runs)
		}
		return nil
	}
	switch {
	case r.Runs < 1 || r.Runs > MaxRecordingRuns:
		return fmt.Errorf("recording runs %d out of range 1..%d", r.Runs, MaxRecordingRuns)
	case r.Overlap != nil && !within(*r.Overlap, 0, 1):
		return fmt.Errorf("recording overlap %v out of range 0..1", *r.Overlap)
	case r.RankCorrelation != nil && !within(*r.RankCorrelation, -1, 1):
		return fmt.Errorf("recording rank correlation %v out of range -1..1", *r.RankCorrelation)
	}
	return nil
}

func within(v, lo, hi float64) bool { return !math.IsNaN(v) && v >= lo && v <= hi }
