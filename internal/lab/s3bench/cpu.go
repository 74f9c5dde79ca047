package s3bench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"warmstart/internal/restore"
)

// CPU accounting per process. On the benchmark's host the node, the
// replay VMM, MinIO and the link (Toxiproxy and the shared-rate
// forwarder, a child process of its own: see link.go) all share the same
// cores, so a cold node's time to ready is bounded by their CPU together,
// not by the node's alone. Each trial reports each process's CPU time
// between the restore call and ready: the node's and the VMM's are what a
// real node pays, MinIO's and the link's are the benchmark's own.

// CPUAccount is the CPU time, in milliseconds, each process of a trial ran
// between the restore call and ready. Its JSON is in integer nanoseconds
// (jsonform.go).
type CPUAccount struct {
	// Node is this process: the node (repository, chunk cache, memory
	// device, restore) and the benchmark's bookkeeping, which is small.
	Node float64
	// VMM is the replay VMM, from its start to ready.
	VMM float64
	// Store is the MinIO server; Link the Toxiproxy and link forwarder
	// process. Neither runs on a real node.
	Store float64
	Link  float64
}

// Product is the CPU a real node pays: the node's and the VMM's.
func (a CPUAccount) Product() float64 { return a.Node + a.VMM }

// Harness is the CPU only the benchmark pays: MinIO's and the link's.
func (a CPUAccount) Harness() float64 { return a.Store + a.Link }

// cpuTime is the CPU time pid's live threads have run so far: the sum of
// the first field (nanoseconds on a CPU) of /proc/PID/task/*/schedstat,
// which the scheduler keeps exactly, where /proc/PID/stat counts 10 ms
// ticks. Zero when the process is gone or pid is 0.
func cpuTime(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var total time.Duration
	for _, t := range tasks {
		data, err := os.ReadFile(filepath.Join(dir, t.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited under us
		}
		field, _, _ := strings.Cut(string(data), " ")
		ns, err := strconv.ParseInt(field, 10, 64)
		if err == nil {
			total += time.Duration(ns)
		}
	}
	return total
}

// cpuClock reads the CPU time of the processes a trial accounts for.
type cpuClock struct {
	node, store, link int // pids
}

// cpuSample is one reading of a cpuClock.
type cpuSample struct {
	node, store, link time.Duration
}

func (c cpuClock) read() cpuSample {
	return cpuSample{node: cpuTime(c.node), store: cpuTime(c.store), link: cpuTime(c.link)}
}

// account is what ran between from and to, with the VMM's CPU until ready
// (its process started within the trial).
func account(from, to cpuSample, vmm time.Duration) CPUAccount {
	return CPUAccount{
		Node: ms(to.node - from.node), VMM: ms(vmm),
		Store: ms(to.store - from.store), Link: ms(to.link - from.link),
	}
}

// vmmPID is the replay VMM's process id, which its ready detail names; 0
// when it does not.
func vmmPID(inst *restore.Instance) int {
	return inst.Ready.Detail.PID
}

// meanCPU averages the trials' CPU accounts.
func meanCPU(ts []Trial) CPUAccount {
	var a CPUAccount
	for _, t := range ts {
		a.Node += t.CPU.Node
		a.VMM += t.CPU.VMM
		a.Store += t.CPU.Store
		a.Link += t.CPU.Link
	}
	if n := float64(len(ts)); n > 0 {
		a.Node, a.VMM, a.Store, a.Link = a.Node/n, a.VMM/n, a.Store/n, a.Link/n
	}
	return a
}
