package restore

import (
	"fmt"
	"sort"
	"strings"

	"warmstart/internal/manifest"
	"warmstart/internal/prefetch"
)

// Policy is how a restore prefetches its startup manifest. The seed's is the
// default; the others reproduce peers' designs so that the benchmark can
// compare them on identical work.
type Policy struct {
	Name string `json:"name"`
	// Readers is the number of readers one task runs.
	Readers int `json:"readers"`
	// BufferBytes is each reader's buffer, and so the largest single read.
	BufferBytes int `json:"buffer_bytes"`
	// MaxReaders is the per-process cap on reads in progress that the
	// policy was designed for; the engine enforces the process's own cap.
	MaxReaders int `json:"max_readers"`
	// Sorted reads the working set in file order instead of first-touch order.
	Sorted bool `json:"sorted"`
	// BeforeStart finishes the prefetch before the guest runs: the VM is
	// restored paused and resumed once every range is in.
	BeforeStart bool `json:"before_start"`
	// Coalesce merges manifest ranges separated by at most this many bytes
	// into one read, trading a little extra data for fewer requests.
	CoalesceGapBytes int64 `json:"coalesce_gap_bytes"`
	// Fill, on the file device, has the device read the lower file and
	// store the bytes straight into the device file's page cache, instead
	// of a buffered read through the device file (see fusedev.Device.Fill).
	Fill bool `json:"fill"`
}

// Policies known by name.
var policies = map[string]Policy{
	// The seed: one reader per task, a 1 MiB buffer, at most four readers per
	// process, through the device, in first-touch order, concurrently with
	// the restore.
	"seed": {Name: "seed", Readers: 1, BufferBytes: 1 << 20, MaxReaders: 4},
	// REAP (vHive): the whole recorded working set in one sequential pass,
	// installed before the VM runs.
	"reap": {Name: "reap", Readers: 1, BufferBytes: 4 << 20, MaxReaders: 1, Sorted: true, BeforeStart: true},
	// E2B: first-touch order, page by page, several workers, concurrently.
	"e2b": {Name: "e2b", Readers: 8, BufferBytes: 4096, MaxReaders: 8},
	// warmstart: first-touch order with nearby runs coalesced so each read
	// is one large device request, two readers (the device serves requests
	// in parallel: one on each core here), concurrently with the restore.
	"warmstart": {Name: "warmstart", Readers: 2, BufferBytes: 1 << 20, MaxReaders: 4, CoalesceGapBytes: 64 << 10, Fill: true},
	"x-fill1":   {Name: "x-fill1", Readers: 1, BufferBytes: 1 << 20, MaxReaders: 4, Fill: true},
	"x-fill2":   {Name: "x-fill2", Readers: 2, BufferBytes: 1 << 20, MaxReaders: 4, Fill: true},
	"x-fill2g":  {Name: "x-fill2g", Readers: 2, BufferBytes: 1 << 20, MaxReaders: 4, Fill: true, CoalesceGapBytes: 64 << 10},
	"x-fill4g":  {Name: "x-fill4g", Readers: 4, BufferBytes: 1 << 20, MaxReaders: 4, Fill: true, CoalesceGapBytes: 64 << 10},
	"x-read2g":  {Name: "x-read2g", Readers: 2, BufferBytes: 1 << 20, MaxReaders: 4, CoalesceGapBytes: 64 << 10},
}

// DefaultPolicy is the policy a restore uses unless told otherwise.
const DefaultPolicy = "warmstart"

// PolicyNames lists the known policies in a stable order.
func PolicyNames() []string {
	names := make([]string, 0, len(policies))
	for n := range policies {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupPolicy returns the named policy.
func LookupPolicy(name string) (Policy, error) {
	p, ok := policies[name]
	if !ok {
		return Policy{}, fmt.Errorf("unknown prefetch policy %q (known: %s)", name, strings.Join(PolicyNames(), ", "))
	}
	return p, nil
}

// Plan turns a manifest's ranges into the policy's read plan.
func (p Policy) Plan(m *manifest.Manifest) []prefetch.Range {
	rs := make([]prefetch.Range, len(m.Ranges))
	for i, r := range m.Ranges {
		rs[i] = prefetch.Range{Offset: r.Offset, Length: r.Length}
	}
	if p.Sorted {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Offset < rs[j].Offset })
	}
	if p.CoalesceGapBytes > 0 || p.Sorted {
		rs = coalesce(rs, p.CoalesceGapBytes, m)
	}
	return rs
}

// coalesce merges each range into its predecessor when it starts at most
// gap bytes after the predecessor's end and in the same memory region. Only
// forward gaps merge, so first-touch order is kept.
func coalesce(rs []prefetch.Range, gap int64, m *manifest.Manifest) []prefetch.Range {
	out := rs[:0:0]
	for _, r := range rs {
		if n := len(out); n > 0 {
			prev := &out[n-1]
			end := prev.Offset + prev.Length
			if r.Offset >= end && r.Offset-end <= gap && sameRegion(m, prev.Offset, r.Offset) {
				prev.Length = r.Offset + r.Length - prev.Offset
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

func sameRegion(m *manifest.Manifest, a, b int64) bool {
	i, ok1 := m.Layout.RegionAt(a)
	j, ok2 := m.Layout.RegionAt(b)
	return ok1 && ok2 && i == j
}

// TaskOptions is the engine's view of the policy.
func (p Policy) TaskOptions() prefetch.TaskOptions {
	return prefetch.TaskOptions{Readers: p.Readers, BufferBytes: p.BufferBytes}
}
