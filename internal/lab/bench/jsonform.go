package bench

import (
	"encoding/json"
	"math"
	"time"

	"warmstart/internal/refine"
)

// The report's JSON follows the JSON convention (docs/json.md): durations
// are integer nanoseconds in keys ending in _ns, and blocks are numbered
// from 1 as the text tables number them. The Go values keep milliseconds
// and 0-based blocks, which the statistics, tables and charts use; these
// methods translate at the JSON boundary only.

// nanos is ms milliseconds as integer nanoseconds.
func nanos(ms float64) int64 { return int64(math.Round(ms * float64(time.Millisecond))) }

// millis is ns nanoseconds as milliseconds.
func millis(ns int64) float64 { return float64(ns) / float64(time.Millisecond) }

// sampleJSON is a Sample as the JSON has it.
type sampleJSON struct {
	N      int   `json:"n"`
	Mean   int64 `json:"mean_ns"`
	Median int64 `json:"median_ns"`
	Min    int64 `json:"min_ns"`
	Max    int64 `json:"max_ns"`
}

// MarshalJSON writes the sample in integer nanoseconds.
func (s Sample) MarshalJSON() ([]byte, error) {
	return json.Marshal(sampleJSON{s.N, nanos(s.Mean), nanos(s.Median), nanos(s.Min), nanos(s.Max)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *Sample) UnmarshalJSON(data []byte) error {
	var j sampleJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*s = Sample{N: j.N, Mean: millis(j.Mean), Median: millis(j.Median), Min: millis(j.Min), Max: millis(j.Max)}
	return nil
}

// intervalJSON is an Interval as the JSON has it; the bounds are left out
// of an interval that has none.
type intervalJSON struct {
	N           int    `json:"n"`
	Mean        int64  `json:"mean_ns"`
	Low         *int64 `json:"low_ns,omitempty"`
	High        *int64 `json:"high_ns,omitempty"`
	AllNegative bool   `json:"all_negative"`
	NoInterval  bool   `json:"no_interval,omitempty"`
}

// MarshalJSON writes the interval in integer nanoseconds, without bounds
// when it has none.
func (iv Interval) MarshalJSON() ([]byte, error) {
	j := intervalJSON{N: iv.N, Mean: nanos(iv.Mean), AllNegative: iv.AllNegative, NoInterval: iv.NoInterval}
	if !iv.NoInterval {
		low, high := nanos(iv.Low), nanos(iv.High)
		j.Low, j.High = &low, &high
	}
	return json.Marshal(j)
}

// specJSON is TrialSpec without its methods.
type specJSON TrialSpec

// MarshalJSON numbers the spec's block from 1 (0: a pilot or learning
// restore, in no block). The trial child reads it back with UnmarshalJSON.
func (s TrialSpec) MarshalJSON() ([]byte, error) {
	j := specJSON(s)
	j.Block = max(s.Block, -1) + 1
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *TrialSpec) UnmarshalJSON(data []byte) error {
	var j specJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*s = TrialSpec(j)
	s.Block--
	return nil
}

// MarshalJSON writes a learning restore's time to ready in integer
// nanoseconds.
func (l LearnStep) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Variant int   `json:"variant"`
		Ready   int64 `json:"ready_ns"`
		refine.Result
	}{l.Variant, nanos(l.ReadyMs), l.Result})
}
