package fusedev

import (
	"sync"
	"time"

	"warmstart/internal/memdev"
)

// observerSet is the generation's observers. A generation is shared by
// every VM restored from its snapshot, so every observer sees every VM's
// requests: the page cache they fill is shared too.
type observerSet struct {
	mu   sync.RWMutex
	list []*memdev.Observer
}

func (s *observerSet) add(o memdev.Observer) func() {
	p := &o
	s.mu.Lock()
	s.list = append(s.list, p)
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, q := range s.list {
			if q == p {
				s.list = append(s.list[:i:i], s.list[i+1:]...)
				return
			}
		}
	}
}

func (s *observerSet) empty() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.list) == 0
}

func (s *observerSet) served(kind memdev.Kind, off int64, n int, took time.Duration) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, o := range s.list {
		(*o).Served(kind, off, n, took)
	}
}

// observe registers o (the attach's memdev.Request.Observer, if any) for
// every range the generation serves from now on, and first tells it, as
// Resident, of every page the generation served before: those are in the
// page cache the VM maps. StopObserving unregisters it.
//
// What the file device sees: read requests reaching the server (a VM's
// fault and the kernel's readaround around it, or a read through the
// device file) and its own fills. A page already in the page cache is
// invisible: a guest touching a prefetched page makes no request. A read
// from this process is prefetch (a buffered read through the device
// file), any other process's read is demand.
func (d *Device) observe(o memdev.Observer) {
	if o == nil {
		return
	}
	g := d.gen
	d.unobserve = g.observers.add(o)
	g.served.runs(g.size, func(off, n int64) { o.Served(memdev.Resident, off, int(n), 0) })
}

// StopObserving implements memdev.ObserverRemover: the attach's observer
// hears of nothing more (the generation may serve other VMs on).
func (d *Device) StopObserving() {
	d.obsOnce.Do(func() {
		if d.unobserve != nil {
			d.unobserve()
		}
	})
}
