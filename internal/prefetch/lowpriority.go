package prefetch

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// LowPriorityNice is the nice value of a LowPriority task's readers.
const LowPriorityNice = 19

// lowPriority is the process's threads at LowPriorityNice, each locked to
// a goroutine that runs one read at a time and then waits for the next. They are never ended and never handed back to the runtime:
//
//   - handed back at nice 19, a thread would run whatever goroutine came
//     next (the device's demand reads, which a guest waits for) at it;
//   - ended, a thread takes with it every child process it started with a
//     parent-death signal. Go starts a child from whichever thread its
//     goroutine runs on, and the VMM drivers ask for SIGKILL when the
//     parent dies, so a reader that locked such a thread and let it end
//     killed a running VMM.
//
// There are as many as low-priority reads ever ran at once: at most the
// engine's MaxReaders (one engine per process), since a read takes one
// only once it holds one of the engine's slots.
var lowPriority struct {
	mu   sync.Mutex
	idle []chan func()
}

// starvedDelay: a low-priority read whose thread waited for a CPU longer
// than this, and longer than it ran, found none idle. Nice 19 is meant to
// use CPU the VMM leaves idle; on a host whose CPUs other work keeps busy
// it only makes the reads wait, and the guest catches up with them.
const starvedDelay = 2 * time.Millisecond

// runLowPriority runs fn on one of those threads and returns when it has,
// and whether the thread waited for a CPU meanwhile (starvedDelay).
func runLowPriority(fn func()) (starved bool) {
	lowPriority.mu.Lock()
	var w chan func()
	if n := len(lowPriority.idle); n > 0 {
		w, lowPriority.idle = lowPriority.idle[n-1], lowPriority.idle[:n-1]
	} else {
		w = make(chan func())
		go lowPriorityWorker(w)
	}
	lowPriority.mu.Unlock()
	done := make(chan struct{})
	w <- func() {
		defer close(done)
		ran, waited := threadCPU()
		fn()
		ran2, waited2 := threadCPU()
		starved = waited2-waited > max(ran2-ran, starvedDelay)
	}
	<-done
	lowPriority.mu.Lock()
	lowPriority.idle = append(lowPriority.idle, w)
	lowPriority.mu.Unlock()
	return starved
}

// threadCPU is how long the calling thread has run and waited for a CPU
// (/proc/thread-self/schedstat); zero if the kernel does not say.
func threadCPU() (ran, waited time.Duration) {
	b, err := os.ReadFile("/proc/thread-self/schedstat")
	if err != nil {
		return 0, 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, 0
	}
	r, err1 := strconv.ParseInt(string(f[0]), 10, 64)
	w, err2 := strconv.ParseInt(string(f[1]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0
	}
	return time.Duration(r), time.Duration(w)
}

// lowPriorityWorker runs the functions sent on w, forever, on a thread of
// its own at LowPriorityNice (if the priority cannot change, at the
// process's: the reads are then only not deferred to the VMM).
func lowPriorityWorker(w chan func()) {
	runtime.LockOSThread()
	_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), LowPriorityNice)
	for fn := range w {
		fn()
	}
}
