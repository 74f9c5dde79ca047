package restore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/restore"
)

// The tests here hold a prefetch read inside the FUSE server. They use the
// seed's policy, whose one reader does buffered reads through the device
// file, so that a held read stops the whole task; and replay VMMs that
// touch memory far from that read, so that the guests become ready while
// it is held.

// TestSharedTaskSurvivesOneConsumerLeaving: two restores of one snapshot on
// one device generation share one task; stopping one does not cancel it for
// the other, which sees it complete.
func TestSharedTaskSurvivesOneConsumerLeaving(t *testing.T) {
	e := newEnv(t, envOptions{})
	src := e.source(t)
	first := e.manifest(t).Ranges[0].Offset
	gate := e.holdReadsAt(t, first)
	r, _, expected := e.restorerWithTrace(t, farTrace(t, first))
	opts := restore.Options{Prefetch: restore.ModeOn, Policy: policy(t, "seed")}

	a := e.restore(t, r, src, opts)
	waitFor(t, gate.arrived, "the prefetch read to reach the server")
	b := e.restore(t, r, src, opts)
	checkHash(t, a, expected)
	checkHash(t, b, expected)
	if a.Generation != b.Generation {
		t.Fatalf("restores on generations %d and %d, want one shared generation", a.Generation, b.Generation)
	}
	subA, subB := restore.PrefetchSubscription(a), restore.PrefetchSubscription(b)
	if subA == nil || subB == nil {
		t.Fatal("a restore has no prefetch subscription")
	}
	if st := e.restorer.Engine.Stats(); st.TasksStarted != 1 {
		t.Fatalf("%d tasks started, want 1 shared", st.TasksStarted)
	}
	if subA.Done() != subB.Done() {
		t.Error("the two restores were told of different tasks")
	}

	// A leaves while the task's read is held: its stop must not wait for
	// that read, and must leave the task running for B.
	stop(t, a)
	if got := e.observer.lastEnded(t); got != prefetch.Running {
		t.Errorf("task state when the first consumer left: %v, want running", got)
	}
	select {
	case <-subB.Done():
		t.Fatalf("task ended (%v: %v) when one of two consumers left", subB.State(), subB.Err())
	default:
	}

	gate.open()
	waitFor(t, subB.Done(), "the shared task to end")
	if st, err := subB.State(), subB.Err(); st != prefetch.Completed || err != nil {
		t.Fatalf("task ended %v (%v), want completed", st, err)
	}
	if st := e.restorer.Engine.Stats(); st.TasksStarted != 1 || st.TasksCancelled != 0 || st.TasksCompleted != 1 {
		t.Errorf("engine stats %+v, want one task, completed, none cancelled", st)
	}
	if got, want := subB.BytesFetched(), e.manifest(t).TotalBytes(); got != want {
		t.Errorf("task fetched %d bytes, want the manifest's %d", got, want)
	}
	stop(t, b)
}

// TestLastConsumerLeavingCancelsQueuedReads: with one reader slot in the
// process, task 1's read is held in the server and task 2's first read
// waits for the slot. When task 2's only consumer leaves, its queued read is
// cancelled at once. When task 1's last consumer leaves, its stop waits for
// the held read, and no read follows it.
func TestLastConsumerLeavingCancelsQueuedReads(t *testing.T) {
	e := newEnv(t, envOptions{engine: prefetch.Options{MaxReaders: 1}})
	src := e.source(t)
	first := e.manifest(t).Ranges[0].Offset
	gate := e.holdReadsAt(t, first)
	r, vm, expected := e.restorerWithTrace(t, farTrace(t, first))
	opts := restore.Options{Prefetch: restore.ModeOn, Policy: policy(t, "seed")}

	one := e.restore(t, r, src, opts)
	waitFor(t, gate.arrived, "task 1's read to reach the server")
	vmOne := vm.last(t)
	opts.DeviceKey = "other-generation"
	two := e.restore(t, r, src, opts)
	checkHash(t, one, expected)
	checkHash(t, two, expected)
	if one.Generation == two.Generation {
		t.Fatal("the restores share a generation; the test needs two tasks")
	}
	subTwo := restore.PrefetchSubscription(two)
	if st := subTwo.State(); st != prefetch.Queued {
		t.Fatalf("task 2 is %v while the only reader slot is held, want queued", st)
	}

	stop(t, two)
	if st, err := subTwo.State(), subTwo.Err(); st != prefetch.Cancelled || err == nil {
		t.Errorf("task 2 ended %v (%v), want cancelled", st, err)
	}
	if st := e.restorer.Engine.Stats(); st.Fetches != 0 || st.ReadersInFlight != 1 {
		t.Errorf("engine stats %+v: want task 1's held read in flight and no read returned", st)
	}

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		stopped <- one.Stop(ctx)
	}()
	// The VM stops first; then the stop waits for the held read.
	waitFor(t, vmOne.Exited(), "the VMM to exit")
	select {
	case err := <-stopped:
		t.Fatalf("stop returned (%v) while a prefetch read was held in the server", err)
	default:
	}
	gate.open()
	if err := waitFor(t, stopped, "the stop to return"); err != nil {
		t.Fatal(err)
	}
	subOne := restore.PrefetchSubscription(one)
	if st := subOne.State(); st != prefetch.Cancelled {
		t.Errorf("task 1 ended %v, want cancelled", st)
	}
	if got := e.observer.lastEnded(t); got != prefetch.Cancelled {
		t.Errorf("the stop saw task 1 %v, want cancelled", got)
	}
	// Only the held read ran: nothing started after it returned.
	if st := e.restorer.Engine.Stats(); st.Fetches != 1 || st.TasksCancelled != 2 || st.ReadersInFlight != 0 {
		t.Errorf("engine stats %+v: want exactly the one held read, both tasks cancelled", st)
	}
}

// TestLateSubscriberLearnsCompletion: a restore that joins after the task
// completed learns that it completed, at once and without reading again,
// also once the consumer that started it has left.
func TestLateSubscriberLearnsCompletion(t *testing.T) {
	e := newEnv(t, envOptions{})
	src := e.source(t)
	opts := restore.Options{Prefetch: restore.ModeOn, Policy: policy(t, "seed")}

	first := e.restore(t, e.restorer, src, opts)
	checkHash(t, first, e.ref.expected)
	sub := restore.PrefetchSubscription(first)
	waitFor(t, sub.Done(), "the prefetch task to end")
	if st, err := sub.State(), sub.Err(); st != prefetch.Completed || err != nil {
		t.Fatalf("task ended %v (%v), want completed", st, err)
	}
	done := e.restorer.Engine.Stats()

	late := func(what string) *restore.Instance {
		inst := e.restore(t, e.restorer, src, opts)
		checkHash(t, inst, e.ref.expected)
		if inst.Generation != first.Generation {
			t.Fatalf("%s: generation %d, want the warm generation %d", what, inst.Generation, first.Generation)
		}
		if inst.Prefetch.State != "completed" {
			t.Errorf("%s: prefetch state %q at ready, want completed", what, inst.Prefetch.State)
		}
		s := restore.PrefetchSubscription(inst)
		select {
		case <-s.Done():
		default:
			t.Errorf("%s: completion channel not closed for a task that had ended", what)
		}
		if st := e.restorer.Engine.Stats(); st.TasksStarted != done.TasksStarted || st.Fetches != done.Fetches {
			t.Errorf("%s: engine stats %+v, want no task or read since %+v", what, st, done)
		}
		// Every page the guest touched was cached by the first restore;
		// the host may have reclaimed a sliver of them since (DAMON
		// pageout), never most: a generation that is not shared reads
		// every touched page again.
		if got, first := inst.DeviceBytes.BytesRead, first.DeviceBytes.BytesRead; got > first/100 {
			t.Errorf("%s: %d bytes read from the device, want at most 1%% of the first restore's %d on a warm generation", what, got, first)
		}
		return inst
	}
	second := late("second restore")
	stop(t, first)
	third := late("restore after the first consumer left")
	stop(t, second)
	stop(t, third)
}

// TestConcurrentRestoresShareOneTask: eight concurrent restores of one
// snapshot run exactly one prefetch task; eight of different device
// generations never have more than four reads in flight.
func TestConcurrentRestoresShareOneTask(t *testing.T) {
	t.Run("one generation", testOneGenerationSharesOneTask)
	t.Run("reader cap across generations", testReaderCapAcrossGenerations)
}

// concurrentRestores is how many restores the sharing tests run at once.
const concurrentRestores = 8

// testOneGenerationSharesOneTask: restores of one generation subscribe to
// one prefetch task, which runs once.
func testOneGenerationSharesOneTask(t *testing.T) {
	const n = concurrentRestores
	e := newEnv(t, envOptions{})
	src := e.source(t)
	insts := restoreConcurrently(t, e.restorer, src, n, func(int) restore.Options {
		return restore.Options{Prefetch: restore.ModeOn, Policy: policy(t, "seed")}
	})
	for _, inst := range insts {
		checkHash(t, inst, e.ref.expected)
		if inst.Generation != insts[0].Generation {
			t.Errorf("restores on generations %d and %d, want one", inst.Generation, insts[0].Generation)
		}
		if restore.PrefetchSubscription(inst).Done() != restore.PrefetchSubscription(insts[0]).Done() {
			t.Errorf("restore %s subscribed to another task", inst.ID)
		}
	}
	waitFor(t, restore.PrefetchSubscription(insts[0]).Done(), "the prefetch task to end")
	st := e.restorer.Engine.Stats()
	t.Logf("engine stats %+v", st)
	if st.TasksStarted != 1 || st.TasksCompleted != 1 {
		t.Errorf("%d tasks started, %d completed; want exactly one, completed", st.TasksStarted, st.TasksCompleted)
	}
	if st.MaxReadersInFlight < 1 || st.MaxReadersInFlight > prefetch.DefaultMaxReaders {
		t.Errorf("at most %d readers were in flight, want 1..%d", st.MaxReadersInFlight, prefetch.DefaultMaxReaders)
	}
	for _, inst := range insts {
		stop(t, inst)
	}
}

// testReaderCapAcrossGenerations: tasks of different generations share the
// engine's reader slots; the tasks beyond the cap queue.
func testReaderCapAcrossGenerations(t *testing.T) {
	const n = concurrentRestores
	e := newEnv(t, envOptions{})
	src := e.source(t)
	first := e.manifest(t).Ranges[0].Offset
	gate := e.holdReadsAt(t, first)
	r, _, expected := e.restorerWithTrace(t, farTrace(t, first))
	insts := restoreConcurrently(t, r, src, n, func(i int) restore.Options {
		return restore.Options{Prefetch: restore.ModeOn, Policy: policy(t, "seed"), DeviceKey: fmt.Sprintf("generation-%d", i)}
	})
	for range prefetch.DefaultMaxReaders {
		waitFor(t, gate.arrived, "a prefetch read to reach the server")
	}
	// Four reads are held and all eight tasks want to read: the other
	// four wait for a slot.
	st := e.restorer.Engine.Stats()
	if st.TasksStarted != n || st.ReadersInFlight != prefetch.DefaultMaxReaders || st.MaxReadersInFlight != prefetch.DefaultMaxReaders {
		t.Errorf("engine stats %+v: want %d tasks, %d reads in flight", st, n, prefetch.DefaultMaxReaders)
	}
	queued := 0
	for _, inst := range insts {
		checkHash(t, inst, expected)
		if restore.PrefetchSubscription(inst).State() == prefetch.Queued {
			queued++
		}
	}
	if queued != n-prefetch.DefaultMaxReaders {
		t.Errorf("%d tasks queued, want %d", queued, n-prefetch.DefaultMaxReaders)
	}
	gate.open()
	for _, inst := range insts {
		sub := restore.PrefetchSubscription(inst)
		waitFor(t, sub.Done(), "a prefetch task to end")
		if sub.State() != prefetch.Completed {
			t.Errorf("task of %s ended %v (%v)", inst.ID, sub.State(), sub.Err())
		}
	}
	st = e.restorer.Engine.Stats()
	t.Logf("engine stats %+v", st)
	if st.MaxReadersInFlight != prefetch.DefaultMaxReaders || st.TasksCompleted != n {
		t.Errorf("engine stats %+v: want at most %d reads ever in flight, %d tasks completed", st, prefetch.DefaultMaxReaders, n)
	}
	for _, inst := range insts {
		stop(t, inst)
	}
}

func restoreConcurrently(t *testing.T, r *restore.Restorer, src restore.Source, n int, opts func(int) restore.Options) []*restore.Instance {
	t.Helper()
	insts := make([]*restore.Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { insts[i], errs[i] = restoreCleanly(t, r, src, opts(i)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
	}
	return insts
}

// TestPrefetchKeysSeparateDevices: a uffd session and a FUSE generation
// that carry the same number are different caches; a uffd restore must not
// join the file device's task (which would install nothing into its VM).
func TestPrefetchKeysSeparateDevices(t *testing.T) {
	e := newEnv(t, envOptions{})
	src := e.source(t)
	// Bring the FUSE generation counter and the uffd session counter to the
	// same value, so that the next restore on each device gets one number.
	bumps := 0
	lastFUSE := func() uint64 {
		bumps++
		dev, err := e.srv.Attach(fmt.Sprintf("bump-%d", bumps), memdev.Request{Memory: src.Memory, IOEngine: 0})
		if err != nil {
			t.Fatal(err)
		}
		release(t, dev)
		return dev.Generation()
	}
	lastUffd := func() uint64 {
		inst := e.restore(t, e.restorer, src, restore.Options{Device: config.DeviceUffd, Prefetch: restore.ModeOff})
		stop(t, inst)
		return inst.Generation
	}
	g, u := lastFUSE(), lastUffd()
	for g != u {
		if bumps > 1000 {
			t.Fatalf("cannot align the counters: FUSE generation %d, uffd session %d", g, u)
		}
		if g < u {
			g = lastFUSE()
		} else {
			u = lastUffd()
		}
	}

	opts := restore.Options{Prefetch: restore.ModeOn, Policy: policy(t, "seed")}
	file := e.restore(t, e.restorer, src, opts)
	waitFor(t, restore.PrefetchSubscription(file).Done(), "the file device's prefetch to end")
	opts.Device = config.DeviceUffd
	vm := e.restore(t, e.restorer, src, opts)
	if file.Generation != vm.Generation {
		t.Fatalf("file generation %d, uffd session %d: the counters were not aligned", file.Generation, vm.Generation)
	}
	checkHash(t, file, e.ref.expected)
	checkHash(t, vm, e.ref.expected)
	if restore.PrefetchSubscription(vm).Key() == restore.PrefetchSubscription(file).Key() {
		t.Errorf("uffd restore joined the file device's task %v", restore.PrefetchSubscription(file).Key())
	}
	if st := e.restorer.Engine.Stats(); st.TasksStarted != 2 {
		t.Errorf("%d tasks started, want one per device", st.TasksStarted)
	}
	stop(t, vm)
	stop(t, file)
}

// TestJoinedTaskReportsItsOwnGaps: a restore that joins another's
// prefetch task reads that task's plan, not its own, and says what that
// plan took along: nothing when the task's policy takes no gaps, the
// task's gaps when its own policy would have taken none.
func TestJoinedTaskReportsItsOwnGaps(t *testing.T) {
	for _, tc := range []struct{ first, second string }{{"seed", "warmstart"}, {"warmstart", "exact"}} {
		t.Run(tc.first+" then "+tc.second, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			src := e.source(t)
			pol := func(name string) restore.Policy {
				if name == "exact" {
					return exactPolicy(t)
				}
				return policy(t, name)
			}
			first := e.restore(t, e.restorer, src, restore.Options{Prefetch: restore.ModeOn, Policy: pol(tc.first)})
			defer stop(t, first)
			waitFor(t, restore.PrefetchSubscription(first).Done(), "the first restore's prefetch")
			started := e.restorer.Engine.Stats().TasksStarted
			second := e.restore(t, e.restorer, src, restore.Options{Prefetch: restore.ModeOn, Policy: pol(tc.second)})
			defer stop(t, second)
			checkHash(t, second, e.ref.expected)
			if second.Generation != first.Generation || e.restorer.Engine.Stats().TasksStarted != started {
				t.Fatalf("the second restore did not join the first's task (generations %d, %d)", first.Generation, second.Generation)
			}
			if tc.first == "warmstart" && first.Prefetch.GapBytes <= 0 {
				t.Fatalf("the warmstart restore's plan took no gaps along: %+v", first.Prefetch)
			}
			if second.Prefetch.GapBytes != first.Prefetch.GapBytes {
				t.Errorf("the second restore reports %d bytes of gaps taken along; the task it joined took %d",
					second.Prefetch.GapBytes, first.Prefetch.GapBytes)
			}
		})
	}
}
