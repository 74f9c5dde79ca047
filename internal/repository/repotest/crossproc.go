package repotest

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"warmstart/internal/repository"
)

// CrossProcess says how the scenarios of RunCrossProcess reach a backend
// from several processes. The backend's TestMain must hand a child to
// ChildMain (see ChildRole).
type CrossProcess struct {
	// Open returns a fresh, empty repository and the description of it
	// (a directory, encoded options) a child's Opener opens it from.
	Open func(t *testing.T) (repository.Repository, string)
	// AssertGone fails t if anything of snapshot id is left in storage.
	AssertGone func(t *testing.T, repo repository.Repository, id string)
	// AssertNoLease, when set, fails t if a lease on id is still held
	// once every holder has ended it or exited.
	AssertNoLease func(t *testing.T, repo repository.Repository, id string)
	// Reclaim runs what reclaims the leftovers of publishers that died
	// before their record, after the grace the backend gives them (it
	// is called right after the death); it must leave a publish in
	// progress alone.
	Reclaim func(t *testing.T, repo repository.Repository)
	// AliasRounds publishers race for one alias each round.
	AliasRounds, Publishers int
	// AttachDeleteRounds is how often an attach races a delete.
	AttachDeleteRounds int
}

// RunCrossProcess checks the behaviours of the repository contract that
// must hold between processes, each scenario on its own repository.
func RunCrossProcess(t *testing.T, cp CrossProcess) {
	t.Run("PublishSameAlias", func(t *testing.T) { testProcessesPublishSameAlias(t, cp) })
	t.Run("AttachRacingDelete", func(t *testing.T) { testAttachRacingDeleteAcrossProcesses(t, cp) })
	t.Run("FailedPublishLeavesNothing", func(t *testing.T) { testFailedPublishLeavesNothing(t, cp) })
	t.Run("KilledPublisherReclaimedLiveOneKept", func(t *testing.T) { testKilledPublisherReclaimed(t, cp) })
}

// testProcessesPublishSameAlias starts processes that publish one alias at
// the same moment: exactly one wins, the others get an alias conflict and
// leave nothing behind.
func testProcessesPublishSameAlias(t *testing.T, cp CrossProcess) {
	r, desc := cp.Open(t)
	for round := range cp.AliasRounds {
		alias := fmt.Sprintf("contended-%d", round)
		b := NewBarrier(t)
		children := make([]*Child, cp.Publishers)
		ids := make([]string, cp.Publishers)
		for i := range children {
			in := NewInputs(t, SmallMemoryBytes)
			children[i] = StartChild(t, "publish", desc, PublishEnv(in, alias), b)
		}
		for i, c := range children {
			ids[i] = c.Ready(t)
		}
		b.Release()
		winner := onlyWinner(t, round, children, ids)
		recs, err := r.List(bg(), repository.Filter{AliasPrefix: alias})
		if err != nil || len(recs) != 1 || recs[0].ID != winner {
			t.Fatalf("round %d: List = %v, %v; want only %s", round, recs, err, winner)
		}
		if id, err := r.ResolveAlias(bg(), alias); err != nil || id != winner {
			t.Fatalf("round %d: alias names %s (%v), want %s", round, id, err, winner)
		}
		for _, id := range ids {
			if id != winner {
				cp.AssertGone(t, r, id)
			}
		}
	}
}

// onlyWinner waits for the publishers of one contended alias (children,
// publishing ids) and returns the id of the one that won: every other
// must have lost with an alias conflict.
func onlyWinner(t *testing.T, round int, children []*Child, ids []string) string {
	t.Helper()
	winner, conflicts := "", 0
	for i, c := range children {
		switch code, sig := c.Wait(t); code {
		case ExitOK:
			if winner != "" {
				t.Fatalf("round %d: two processes won the alias", round)
			}
			winner = ids[i]
		case ExitConflict:
			conflicts++
		default:
			t.Fatalf("round %d: child exited %d (signal %v): %s", round, code, sig, c.Stderr())
		}
	}
	if winner == "" || conflicts != len(children)-1 {
		t.Fatalf("round %d: winner %q, %d conflicts", round, winner, conflicts)
	}
	return winner
}

// testAttachRacingDeleteAcrossProcesses races an attach in a child against
// a delete in the parent: the snapshot stays deleted whatever the order.
func testAttachRacingDeleteAcrossProcesses(t *testing.T, cp CrossProcess) {
	r, desc := cp.Open(t)
	outcomes := map[int]int{}
	for i := range cp.AttachDeleteRounds {
		rec, lease := Publish(t, r, fmt.Sprintf("xrace-%d", i))
		if err := lease.End(); err != nil {
			t.Fatal(err)
		}
		b := NewBarrier(t)
		c := StartChild(t, "attach", desc, map[string]string{ChildIDEnv: rec.ID}, b)
		c.Ready(t)
		b.Release()
		deleteErr := r.Delete(bg(), rec.ID)
		code, sig := c.Wait(t)
		if deleteErr != nil {
			t.Fatalf("iteration %d: Delete: %v", i, deleteErr)
		}
		if cp.AssertNoLease != nil {
			cp.AssertNoLease(t, r, rec.ID)
		}
		if code != ExitOK && code != ExitNotFound {
			t.Fatalf("iteration %d: attach child exited %d (signal %v): %s", i, code, sig, c.Stderr())
		}
		outcomes[code]++
		cp.AssertGone(t, r, rec.ID)
	}
	t.Logf("attach succeeded %d times, found the snapshot deleted %d times", outcomes[ExitOK], outcomes[ExitNotFound])
}

// testFailedPublishLeavesNothing fails a publish half way through its
// memory (its caller gives up): once Publish has returned and the caller
// has ended its lease, nothing of the snapshot is left in storage, without
// waiting for any sweep.
func testFailedPublishLeavesNothing(t *testing.T, cp CrossProcess) {
	r, _ := cp.Open(t)
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	ctx, cancel := context.WithCancel(bg())
	defer cancel()
	req := NewInputs(t, LargeMemoryBytes).Request("failed")
	req.Progress = func(p repository.ImportProgress) {
		if p.Artifact == repository.MemoryFileName && 2*p.DoneBytes >= p.TotalBytes {
			cancel()
		}
	}
	if _, err := r.Publish(ctx, lease, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish given up half way: %v, want context.Canceled", err)
	}
	// The lease is the caller's to end; what the publish wrote is gone.
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	cp.AssertGone(t, r, lease.SnapshotID())
	_, err = r.ResolveAlias(bg(), "failed")
	wantErr(t, "alias of the failed publish", err, repository.ErrNotFound)
}

// testKilledPublisherReclaimed kills a publishing process half way through
// its memory while this process has a publish of its own stalled half
// way: the reclaim removes everything of the killed one and nothing of
// the live one, which then completes and reads back whole.
func testKilledPublisherReclaimed(t *testing.T, cp CrossProcess) {
	r, desc := cp.Open(t)
	live := NewInputs(t, LargeMemoryBytes)
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	stalled := StallPublish(t, r, lease, live.Request("live"))
	defer stalled.Resume() // before lease.End, which waits for it

	c := StartChild(t, "publish-midway", desc, PublishEnv(NewInputs(t, LargeMemoryBytes), "killed"), nil)
	killed := c.Ready(t)
	if err := c.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, sig := c.Wait(t); sig != syscall.SIGKILL {
		t.Fatalf("publisher ended by %v, not SIGKILL: %s", sig, c.Stderr())
	}
	cp.Reclaim(t, r)
	cp.AssertGone(t, r, killed)

	if err := stalled.Wait(); err != nil {
		t.Fatalf("the live publish after the reclaim: %v", err)
	}
	res, err := r.Resolve(bg(), lease.SnapshotID())
	if err != nil {
		t.Fatal(err)
	}
	if got := ResolvedMemorySHA256(t, res); got != live.MemorySHA256 {
		t.Fatalf("the live publish reads back as %s, want %s", got, live.MemorySHA256)
	}
}
