package replay

import "time"

// Pacing thresholds, from measuring time.Sleep on the development hosts
// (2 vCPUs): sleeps of 50 µs to 500 µs overshot by 0.6-1.1 ms at the median,
// sleeps of 1-2 ms by 0.1-0.6 ms at the 99th percentile; time.Now costs
// about 30 ns. So waits shorter than sleepAboveWait busy-wait on the
// monotonic clock, and longer ones sleep all but sleepSlack and busy-wait the
// rest. Busy-waiting burns a CPU, as a running guest vCPU does.
const (
	sleepAboveWait = 2 * time.Millisecond
	sleepSlack     = 1500 * time.Microsecond
)

// pacer spends trace compute time, counted from the end of the previous
// touch, so the time a touch itself takes (a fault served by a device) is
// added to the compute time rather than absorbed by it.
type pacer struct{ since time.Time }

func (p *pacer) reset() { p.since = time.Now() }

// wait spends d since the last reset. It returns false if stop closed
// during a sleep (a busy-wait is short enough to finish).
func (p *pacer) wait(d time.Duration, stop <-chan struct{}) bool {
	if d <= 0 {
		return true
	}
	deadline := p.since.Add(d)
	if left := time.Until(deadline); left >= sleepAboveWait {
		t := time.NewTimer(left - sleepSlack)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			return false
		}
	}
	for time.Now().Before(deadline) {
	}
	return true
}
