package bench

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/procstat"
	"warmstart/internal/restore"
)

// MaxConcurrency bounds --concurrency: each restore is a VMM process.
const MaxConcurrency = 16

// validateConcurrency checks --concurrency: 1..MaxConcurrency (0 is 1),
// with the replay VMM, whose every restore checks what its guest read,
// and without learned columns, which learn from one restore per trial.
func (o *Options) validateConcurrency() error {
	switch {
	case o.Concurrency <= 1 && o.Concurrency >= 0:
		return nil
	case o.Concurrency < 0 || o.Concurrency > MaxConcurrency:
		return fmt.Errorf("bench: --concurrency %d: want 1..%d", o.Concurrency, MaxConcurrency)
	case o.VMM != "" && o.VMM != config.DriverReplay:
		return fmt.Errorf("bench: --concurrency %d: needs the replay VMM", o.Concurrency)
	}
	for _, p := range o.Policies {
		if learned(p) {
			return fmt.Errorf("bench: --concurrency %d: column %q learns from one restore per trial", o.Concurrency, p)
		}
	}
	return nil
}

// restoreConcurrently starts TrialSpec.Concurrency timed restores of src
// at once on the trial's node (one restorer: they share the device
// generation and the prefetch task, as a daemon's would) and returns them
// once every one is ready, the first started first. When one fails, the
// others are stopped and its error returned.
func (t *trial) restoreConcurrently(src restore.Source, opts restore.Options) ([]*restore.Instance, error) {
	n := max(t.spec.Concurrency, 1)
	insts := make([]*restore.Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { insts[i], errs[i] = t.r.Restore(t.ctx, src, opts) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		var ok []*restore.Instance
		for _, in := range insts {
			if in != nil {
				ok = append(ok, in)
			}
		}
		return nil, errors.Join(err, t.stopAll(ok))
	}
	return insts, nil
}

// stopAll stops the instances in order, joining their errors.
func (t *trial) stopAll(insts []*restore.Instance) error {
	var errs []error
	for _, in := range insts {
		errs = append(errs, in.Stop(t.stopCtx))
	}
	return errors.Join(errs...)
}

// ConcurrentRestore is what one of a trial's concurrent restores found by
// its ready: where its time went, beside the others'.
type ConcurrentRestore struct {
	Timings restore.Timings `json:"timings"`
	// LatePages and DemandRequests are its own guest's (startupset.Report).
	LatePages      int64 `json:"late_pages"`
	DemandRequests int64 `json:"demand_requests"`
	// VMMCPU and VMMMajorFaults are its VMM process's, start to ready.
	VMMCPU         time.Duration `json:"vmm_cpu_ns"`
	VMMMajorFaults int64         `json:"vmm_major_faults"`
}

// concurrentRestoreOf is inst's part of a trial's report.
func concurrentRestoreOf(inst *restore.Instance) ConcurrentRestore {
	c := ConcurrentRestore{Timings: inst.Timings, LatePages: inst.StartupSet.LatePages, DemandRequests: inst.StartupSet.DemandRequests}
	if v := inst.Cost.VMM; v != nil {
		c.VMMCPU, c.VMMMajorFaults = v.CPU(), v.MajorFaults
	}
	return c
}

// trialCost is what a trial's restores cost until the last was ready:
// the node's usage over the longest window any restore measured (they
// start together in one process, so that window holds the others' work),
// every VMM's summed, and every device's bytes counted once. The first
// restore's own cost alone would leave out the other VMMs, which share
// the cores with it.
//
// Restores of one generation (the file device) share its counters, and
// each read them over its own window: like the node's, the longest holds
// the others' reads, and a sum would count the bytes read once for all
// of them once per restore. Devices of their own (uffd) add up.
func trialCost(insts []*restore.Instance) restore.Cost {
	var c restore.Cost
	var vmms procstat.Usage
	perGeneration := map[uint64]restore.Cost{}
	for _, in := range insts {
		if in.Cost.Node.CPU() > c.Node.CPU() {
			c.Node = in.Cost.Node
		}
		if in.Cost.VMM != nil {
			vmms = vmms.Add(*in.Cost.VMM)
			c.VMM = &vmms
		}
		if g := perGeneration[in.Generation]; in.Cost.LowerBytesRead >= g.LowerBytesRead {
			perGeneration[in.Generation] = in.Cost
		}
	}
	for _, g := range perGeneration {
		c.LowerBytesRead += g.LowerBytesRead
		c.CopiedBytes += g.CopiedBytes
	}
	return c
}

// HostCPU is what every CPU of the host did over a trial's timed
// restores, from the first one's start to the last one's ready
// (/proc/stat): on a host with N cores, Busy + Idle + IOWait is about N
// times Wall. Idle or waiting CPU while restores are not ready is time
// they spent waiting on something other than the CPU. Busy is the
// host's, other work included: Node is this process's share of it,
// and IRQ the interrupts' and softirqs' (a cold lower's disk
// completions), which no process is charged for.
type HostCPU struct {
	// Wall is the time between the two readings.
	Wall   time.Duration `json:"wall_ns"`
	Busy   time.Duration `json:"busy_ns"`
	Idle   time.Duration `json:"idle_ns"`
	IOWait time.Duration `json:"iowait_ns"`
	IRQ    time.Duration `json:"irq_ns"`
	Node   time.Duration `json:"node_ns"`
}

// readHostCPU reads the host's cumulative CPU times and this process's;
// ok is false where /proc/stat or getrusage cannot be read (the figure
// is then left out).
func readHostCPU() (HostCPU, bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return HostCPU{}, false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	h, ok := parseHostCPU(line)
	self, err := procstat.Self()
	h.Node = self.CPU()
	h.Wall = time.Duration(time.Now().UnixNano())
	return h, ok && err == nil
}

// parseHostCPU parses /proc/stat's first line: "cpu" and the clock ticks
// (USER_HZ, 100 on Linux) spent in user, nice, system, idle, iowait, irq,
// softirq and steal.
func parseHostCPU(line string) (HostCPU, bool) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return HostCPU{}, false
	}
	var ticks [8]time.Duration
	for i := range ticks {
		v, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return HostCPU{}, false
		}
		ticks[i] = time.Duration(v) * 10 * time.Millisecond
	}
	return HostCPU{Busy: ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6] + ticks[7], Idle: ticks[3],
		IOWait: ticks[4], IRQ: ticks[5] + ticks[6]}, true
}

// Sub is what the host did between an earlier reading o and h.
func (h HostCPU) Sub(o HostCPU) HostCPU {
	return HostCPU{Wall: h.Wall - o.Wall, Busy: h.Busy - o.Busy, Idle: h.Idle - o.Idle,
		IOWait: h.IOWait - o.IOWait, IRQ: h.IRQ - o.IRQ, Node: h.Node - o.Node}
}
