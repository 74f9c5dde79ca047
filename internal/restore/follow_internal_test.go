package restore

import (
	"context"
	"testing"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/startupset"
)

// The device observer routes demand requests, and only those, to the
// task: the latest one made before the task was joined, then each one,
// until it stops following.
func TestDeviceObserverRoutesDemandUntilStopped(t *testing.T) {
	e := prefetch.NewEngine(prefetch.Options{BufferBytes: 4096})
	hold := make(chan struct{})
	target := prefetch.TargetFunc(func(ctx context.Context, _ int64, _ []byte) error {
		select {
		case <-hold:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	var plan []prefetch.Range
	for i := range 8 {
		plan = append(plan, prefetch.Range{Offset: int64(i) * 8192, Length: 4096})
	}
	rec := startupset.NewTimeline(time.Now())
	o := newDeviceObserver(rec)
	jumps := func() uint64 { return e.Stats().Jumps }

	o.Served(memdev.Demand, plan[2].Offset, 4096, 0) // before the task exists
	sub := e.Join(prefetch.Key{Device: "test", Generation: 1, Digest: "d"}, target, plan, prefetch.TaskOptions{Follow: true})
	o.startFollowing(sub)
	if jumps() != 1 {
		t.Fatalf("%d jumps after joining; want 1, to the fault made before", jumps())
	}
	o.Served(memdev.Prefetch, plan[5].Offset, 4096, 0)
	o.Served(memdev.Resident, plan[6].Offset, 4096, 0)
	if jumps() != 1 {
		t.Fatalf("%d jumps; prefetch and resident ranges are not the guest's and must not move the cursor", jumps())
	}
	o.Served(memdev.Demand, plan[4].Offset, 4096, 0)
	if jumps() != 2 {
		t.Fatalf("%d jumps after a fault ahead; want 2", jumps())
	}
	o.stopFollowing()
	o.Served(memdev.Demand, plan[7].Offset, 4096, 0)
	if jumps() != 2 {
		t.Errorf("%d jumps after following stopped (ready); want still 2", jumps())
	}
	o.startFollowing(sub)
	if jumps() != 2 {
		t.Errorf("following started again after it stopped for good")
	}
	if n := len(rec.Events()); n != 5 {
		t.Errorf("the recorder saw %d ranges, want all 5", n)
	}
	close(hold)
	if err := sub.LeaveWait(context.Background()); err != nil {
		t.Fatal(err)
	}
}
