package s3bench

import (
	"encoding/json"
	"math"
	"time"
)

// The report's JSON follows the JSON convention (docs/json.md): durations
// are integer nanoseconds in keys ending in _ns, sizes integer bytes (or,
// for means, a number of bytes) in keys ending in _bytes. The Go values
// keep the milliseconds, MiB and KiB the table prints; these methods
// translate at the JSON boundary only.

// nanos is ms milliseconds as integer nanoseconds.
func nanos(ms float64) int64 { return int64(math.Round(ms * float64(time.Millisecond))) }

// optionsJSON holds what Options writes beyond its tagged fields.
type optionsJSON struct {
	Latency                 int64 `json:"latency_ns"`
	ReadaroundBytes         int64 `json:"readaround_bytes"`
	PrefetchReadaroundBytes int64 `json:"prefetch_readaround_bytes"`
}

type plainOptions Options

// MarshalJSON writes the options with the latency in nanoseconds and the
// readaround windows in bytes.
func (o Options) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		plainOptions
		optionsJSON
	}{plainOptions(o), optionsJSON{
		Latency:         int64(time.Duration(o.LatencyMs) * time.Millisecond),
		ReadaroundBytes: o.ReadaroundKiB << 10, PrefetchReadaroundBytes: o.PrefetchReadaroundKiB << 10,
	}})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (o *Options) UnmarshalJSON(data []byte) error {
	var j struct {
		plainOptions
		optionsJSON
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	*o = Options(j.plainOptions)
	o.LatencyMs = int(time.Duration(j.Latency) / time.Millisecond)
	o.ReadaroundKiB, o.PrefetchReadaroundKiB = j.ReadaroundBytes>>10, j.PrefetchReadaroundBytes>>10
	return nil
}

type plainTrial Trial

// MarshalJSON writes the trial's time to ready and the guest's wait on
// memory in nanoseconds.
func (t Trial) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		plainTrial
		Ready       int64 `json:"ready_ns"`
		DemandStall int64 `json:"demand_stall_ns"`
	}{plainTrial(t), nanos(t.ReadyMs), nanos(t.DemandStallMs)})
}

// phasesJSON are Phases in nanoseconds.
type phasesJSON struct {
	DeviceAcquired    int64 `json:"device_acquired_ns"`
	ManifestValidated int64 `json:"manifest_validated_ns"`
	StreamFirstBlock  int64 `json:"stream_first_block_ns"`
	VMStarted         int64 `json:"vm_started_ns"`
	StreamEnded       int64 `json:"stream_ended_ns"`
	Ready             int64 `json:"ready_ns"`
	DemandStall       int64 `json:"demand_stall_ns"`
}

type plainSummary Summary

// MarshalJSON writes the mean bytes in bytes and the mean phases in
// nanoseconds.
func (s Summary) MarshalJSON() ([]byte, error) {
	p := s.Phases
	return json.Marshal(struct {
		plainSummary
		MeanBytes float64    `json:"mean_bytes"`
		Phases    phasesJSON `json:"phases"`
	}{plainSummary(s), s.MeanMiB * (1 << 20), phasesJSON{
		nanos(p.DeviceAcquired), nanos(p.ManifestValidated), nanos(p.StreamFirstBlock),
		nanos(p.VMStarted), nanos(p.StreamEnded), nanos(p.Ready), nanos(p.DemandStall),
	}})
}

type plainReport Report

// MarshalJSON writes what the manifest covers in bytes and the link's
// floor in nanoseconds (left out when there is none).
func (r Report) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		plainReport
		ManifestBytes int64 `json:"manifest_bytes"`
		LinkFloor     int64 `json:"link_floor_ns,omitempty"`
	}{plainReport(r), int64(math.Round(r.ManifestMiB * (1 << 20))), nanos(r.LinkFloorMs)})
}

// cpuJSON is a CPUAccount in integer nanoseconds.
type cpuJSON struct {
	Node  int64 `json:"node_ns"`
	VMM   int64 `json:"vmm_ns"`
	Store int64 `json:"store_ns"`
	Link  int64 `json:"link_ns"`
}

// MarshalJSON writes each process's CPU in integer nanoseconds.
func (a CPUAccount) MarshalJSON() ([]byte, error) {
	return json.Marshal(cpuJSON{nanos(a.Node), nanos(a.VMM), nanos(a.Store), nanos(a.Link)})
}
