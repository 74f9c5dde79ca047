package prefetch

import (
	"runtime"
	"sync"

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

// runLowPriority runs fn on one of those threads and returns when it has.
func runLowPriority(fn func()) {
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
	w <- func() { defer close(done); fn() }
	<-done
	lowPriority.mu.Lock()
	lowPriority.idle = append(lowPriority.idle, w)
	lowPriority.mu.Unlock()
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
