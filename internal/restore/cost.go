package restore

import (
	"warmstart/internal/memdev"
	"warmstart/internal/procstat"
	"warmstart/internal/vmm"
)

// Cost is what a restore cost the host from its start to ready: the CPU,
// faults and storage reads of the node process and of the VMM process,
// and the bytes the device read and copied.
type Cost struct {
	// Node is this process from the call to Restore to ready. A process
	// that runs restores concurrently (the daemon) counts all of them
	// here: the figure is the process's, not one restore's alone.
	Node procstat.Usage `json:"node"`
	// VMM is the VMM's process from its start to ready; nil when the VMM
	// runs no host process of its own or it could not be read.
	VMM *procstat.Usage `json:"vmm,omitempty"`
	// LowerBytesRead are the bytes the device read from the memory's
	// lower (file or node cache) for this restore.
	LowerBytesRead uint64 `json:"lower_bytes_read"`
	// CopiedBytes are the bytes the device copied while serving them
	// (memdev.CopiesPerByteRead for each byte read).
	CopiedBytes uint64 `json:"copied_bytes"`
}

// costMeter takes the node's reading at the start of a restore.
type costMeter struct {
	start procstat.Usage
	ok    bool
}

func startCost() costMeter {
	u, err := procstat.Self()
	return costMeter{start: u, ok: err == nil}
}

// atReady is the restore's cost now, given the VMM instance and the
// device's counters since acquisition.
func (m costMeter) atReady(vm vmm.VM, dev memdev.Counters) Cost {
	c := Cost{LowerBytesRead: dev.BytesRead, CopiedBytes: memdev.CopiesPerByteRead * dev.BytesRead}
	if now, err := procstat.Self(); err == nil && m.ok {
		c.Node = now.Sub(m.start)
	}
	if p, ok := vm.(vmm.Process); ok && p.PID() > 0 {
		if u, err := procstat.Process(p.PID()); err == nil {
			c.VMM = &u
		}
	}
	return c
}
