package bench

import (
	"fmt"
	"time"

	"warmstart/internal/restore"
)

// CostMeans are the means, over a condition's admitted trials, of their
// timed restores' cost until ready (restore.Cost).
type CostMeans struct {
	NodeUser   time.Duration `json:"node_user_ns"`
	NodeSystem time.Duration `json:"node_system_ns"`
	// VMMCPU and VMMMajorFaults are the VMM process's, from its start to
	// ready; zero for a VMM with no process of its own.
	VMMCPU         time.Duration `json:"vmm_cpu_ns"`
	VMMMajorFaults float64       `json:"vmm_major_faults"`
	// StorageReadBytes are the node process's reads from storage.
	StorageReadBytes float64 `json:"storage_read_bytes"`
	CopiedBytes      float64 `json:"copied_bytes"`
}

// meanCost averages the trials' costs.
func meanCost(cs []restore.Cost) CostMeans {
	var m CostMeans
	if len(cs) == 0 {
		return m
	}
	for _, c := range cs {
		m.NodeUser += c.Node.User
		m.NodeSystem += c.Node.System
		if c.VMM != nil {
			m.VMMCPU += c.VMM.CPU()
			m.VMMMajorFaults += float64(c.VMM.MajorFaults)
		}
		m.StorageReadBytes += float64(c.Node.StorageReadBytes)
		m.CopiedBytes += float64(c.CopiedBytes)
	}
	n := len(cs)
	m.NodeUser /= time.Duration(n)
	m.NodeSystem /= time.Duration(n)
	m.VMMCPU /= time.Duration(n)
	m.VMMMajorFaults /= float64(n)
	m.StorageReadBytes /= float64(n)
	m.CopiedBytes /= float64(n)
	return m
}

// cpuCell prints a cell's CPU: node (user + system) and VMM, in ms.
func cpuCell(c *Cell) string {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	m := c.Cost
	return fmt.Sprintf("%.1f (%.1f+%.1f) / %.1f", ms(m.NodeUser+m.NodeSystem), ms(m.NodeUser), ms(m.NodeSystem), ms(m.VMMCPU))
}

// ioCell prints a cell's I/O: storage reads, copies (MiB), VMM major faults.
func ioCell(c *Cell) string {
	m := c.Cost
	return fmt.Sprintf("%.1f / %.1f / %.0f", m.StorageReadBytes/(1<<20), m.CopiedBytes/(1<<20), m.VMMMajorFaults)
}
