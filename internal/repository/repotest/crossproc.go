package repotest

import (
	"fmt"
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
		winner, conflicts := "", 0
		for i, c := range children {
			switch code, sig := c.Wait(t); code {
			case ExitOK:
				if winner != "" {
					t.Fatalf("round %d: two processes won alias %s", round, alias)
				}
				winner = ids[i]
			case ExitConflict:
				conflicts++
			default:
				t.Fatalf("round %d: child exited %d (signal %v): %s", round, code, sig, c.Stderr())
			}
		}
		if winner == "" || conflicts != cp.Publishers-1 {
			t.Fatalf("round %d: winner %q, %d conflicts", round, winner, conflicts)
		}
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
