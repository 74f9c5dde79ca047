package memdev

import (
	"sync/atomic"
	"time"
)

// Counters is a snapshot of a device generation's counters.
type Counters struct {
	// ReadRequests counts requests served from the lower file: FUSE reads,
	// or page faults and bulk installs on the uffd device.
	ReadRequests uint64 `json:"read_requests"`
	// BytesRead counts bytes read from the lower file.
	BytesRead uint64 `json:"bytes_read"`
	// BytesInFlight is the number of bytes of reads that have started and
	// not yet returned.
	BytesInFlight int64 `json:"bytes_in_flight"`
	// ReadErrors counts reads that failed on the lower file and were
	// answered with an error (EIO, or a fault the handler could not serve).
	ReadErrors uint64 `json:"read_errors"`
	// FirstReadError is the error of the generation's first failed read,
	// "" when none failed: what a restore that fails on a memory fault
	// cannot learn from its VMM.
	FirstReadError string `json:"first_read_error,omitempty"`
}

// Sub returns the counters accumulated between an earlier snapshot o and c.
// BytesInFlight is a level, not a total, and FirstReadError the
// generation's, so c's values are kept.
func (c Counters) Sub(o Counters) Counters {
	return Counters{
		ReadRequests:   c.ReadRequests - o.ReadRequests,
		BytesRead:      c.BytesRead - o.BytesRead,
		BytesInFlight:  c.BytesInFlight,
		ReadErrors:     c.ReadErrors - o.ReadErrors,
		FirstReadError: c.FirstReadError,
	}
}

// CounterSet is the live, concurrently updated form of Counters.
type CounterSet struct {
	readRequests  atomic.Uint64
	bytesRead     atomic.Uint64
	bytesInFlight atomic.Int64
	readErrors    atomic.Uint64
	firstError    atomic.Pointer[string]
}

// Begin records that a read of n bytes has started.
func (s *CounterSet) Begin(n int) { s.bytesInFlight.Add(int64(n)) }

// End records that a read of n requested bytes has returned, with got bytes
// read and err its outcome.
func (s *CounterSet) End(n, got int, err error) {
	s.bytesInFlight.Add(-int64(n))
	s.readRequests.Add(1)
	if got > 0 {
		s.bytesRead.Add(uint64(got))
	}
	if err != nil {
		s.readErrors.Add(1)
		msg := err.Error()
		s.firstError.CompareAndSwap(nil, &msg)
	}
}

// Load returns a consistent-enough snapshot of the counters.
func (s *CounterSet) Load() Counters {
	c := Counters{
		ReadRequests:  s.readRequests.Load(),
		BytesRead:     s.bytesRead.Load(),
		BytesInFlight: s.bytesInFlight.Load(),
		ReadErrors:    s.readErrors.Load(),
	}
	if p := s.firstError.Load(); p != nil {
		c.FirstReadError = *p
	}
	return c
}

// Touch is the first access to one page of guest memory.
type Touch struct {
	// Offset is the page's logical offset (its offset in the memory file).
	Offset int64 `json:"offset"`
	// Nanos is the monotonic time since tracing started.
	Nanos int64 `json:"nanos"`
}

// Kind says why a device brought a range of memory in.
type Kind uint8

const (
	// Demand is a request of the guest: a FUSE read from another process
	// (the VMM's fault and its readaround) or a userfaultfd page fault.
	Demand Kind = iota
	// Prefetch is a range brought in for the startup manifest: a fill, a
	// read through the device file by this process, or a uffd install.
	Prefetch
	// Resident is a range that was already in the VM's reach when the
	// observer was registered: pages a shared file device generation had
	// served before (to an earlier VM or an earlier prefetch task).
	Resident
)

// String names the kind as the JSON and metrics do.
func (k Kind) String() string {
	switch k {
	case Demand:
		return "demand"
	case Prefetch:
		return "prefetch"
	case Resident:
		return "resident"
	}
	return "unknown"
}

// Observer is told of every range a device served from its lower file,
// once it is in the guest's reach, with how long serving it took. Calls
// come from the device's serving goroutines, concurrently; an Observer
// must be quick and must not call back into the device.
type Observer interface {
	Served(kind Kind, off int64, n int, took time.Duration)
}

// StuckReadWait bounds how long closing a device waits for a read of its
// memory source still in progress: a read of a local or cached lower
// returns in far less, so one still running is stuck on storage that
// stopped answering, which the kernel will not interrupt. Past it, the
// device closes anyway and says so, and the read ends by itself.
const StuckReadWait = 10 * time.Second

// CopiesPerByteRead is how many times a device copies each byte it counts
// in Counters.BytesRead: once from the lower into its read buffer, once
// from there into the page cache (a FUSE reply or fill) or into the
// guest's memory (UFFDIO_COPY). A byte the kernel reads for the guest
// without the device (readahead it started, FUSE passthrough) is neither
// read nor copied by the device.
const CopiesPerByteRead = 2
