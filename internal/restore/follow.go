package restore

import (
	"sync"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/startupset"
)

// deviceObserver is what a restore registers as its memory device's
// observer: it records every range served for the startup-set accounting,
// and routes the guest's demand requests to the restore's prefetch task,
// so that a task that follows the guest (Policy.Follow) moves its cursor
// to where the guest is instead of reading memory the guest has passed.
// The device calls it while serving, so it only records and forwards: the
// task's Follow never blocks.
type deviceObserver struct {
	rec *startupset.Timeline

	mu sync.Mutex
	// sub is where demand requests go: set once the restore has joined
	// its task, cleared at ready and at stop (the guest's faults after
	// ready are its workload, not its start-up).
	sub *prefetch.Subscription
	// last is the latest demand request before the task was joined: on
	// a device the VMM connects to (memdev.Connecter) the guest runs
	// before prefetch starts, and the task starts where the guest is.
	last     demandRequest
	finished bool
}

type demandRequest struct {
	off int64
	n   int
}

var _ memdev.Observer = (*deviceObserver)(nil)

func newDeviceObserver(rec *startupset.Timeline) *deviceObserver {
	return &deviceObserver{rec: rec}
}

// Served implements memdev.Observer.
func (o *deviceObserver) Served(kind memdev.Kind, off int64, n int, took time.Duration) {
	o.rec.Served(kind, off, n, took)
	if kind == memdev.Demand {
		if sub := o.route(demandRequest{off, n}); sub != nil {
			sub.Follow(off, n)
		}
	}
}

// route returns the subscription a demand request goes to, or keeps the
// request as the latest one when there is none yet.
func (o *deviceObserver) route(d demandRequest) *prefetch.Subscription {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sub == nil && !o.finished {
		o.last = d
	}
	return o.sub
}

// startFollowing routes demand requests to sub from now on, starting with
// the latest one made before.
func (o *deviceObserver) startFollowing(sub *prefetch.Subscription) {
	o.mu.Lock()
	if o.finished {
		o.mu.Unlock()
		return
	}
	o.sub = sub
	last := o.last
	o.mu.Unlock()
	if last.n > 0 {
		// A request routed since then may already have moved the cursor
		// further; the cursor never moves back, so this one is then moot.
		sub.Follow(last.off, last.n)
	}
}

// stopFollowing ends the routing for good; a request being forwarded may
// still arrive, which the task takes as any other.
func (o *deviceObserver) stopFollowing() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sub, o.finished = nil, true
}

// guest is the restore following its guest until ready: the timeline of
// what the device served, the observer routing its faults to the
// prefetch task, and when that task ended.
type guest struct {
	timeline *startupset.Timeline
	observer *deviceObserver
	sub      *prefetch.Subscription
	// ended is when the task was seen ending; it is set before endedCh
	// closes.
	ended   time.Time
	endedCh chan struct{}
}

func newGuest(t0 time.Time) *guest {
	timeline := startupset.NewTimeline(t0)
	return &guest{timeline: timeline, observer: newDeviceObserver(timeline)}
}

// follow routes the guest's faults to sub from now on, notes when its task
// ends, then runs onEnd (possibly nil).
func (g *guest) follow(sub *prefetch.Subscription, onEnd func()) {
	g.sub = sub
	g.observer.startFollowing(sub)
	g.endedCh = make(chan struct{})
	go func() {
		<-sub.Done()
		g.ended = time.Now()
		close(g.endedCh)
		if onEnd != nil {
			onEnd()
		}
	}()
}

// finish stops following at ready: faults after it are the guest's
// workload, not its start-up, and the device, which may serve other VMs
// on, hears of this one no more.
func (g *guest) finish(dev memdev.Device) {
	g.observer.stopFollowing()
	g.timeline.Stop()
	stopObserving(dev)
}

// report records, at ready, the task's state and when it ended.
func (g *guest) report(t0 time.Time, rep *PrefetchReport) {
	if g.sub == nil {
		return
	}
	select {
	case <-g.endedCh:
		rep.EndedAfter = g.ended.Sub(t0)
	default:
	}
	rep.State = g.sub.State().String()
	if err := g.sub.Err(); err != nil {
		rep.Reason = err.Error()
	}
}
