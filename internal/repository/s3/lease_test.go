package s3

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// twoNodes opens two repositories on one prefix with separate node caches,
// as two daemons on two nodes have them.
func twoNodes(t *testing.T) (a, b *Repo) {
	t.Helper()
	needServer(t)
	o := testOptions(t, server.Endpoint)
	a = openWith(t, o)
	o.CacheDir = t.TempDir()
	return a, openWith(t, o)
}

// A lease taken on one node is seen by LeaseHeld on another (the daemon's
// resume asks it before recording), until it ends.
func TestLeaseSeenAcrossNodes(t *testing.T) {
	t.Parallel()
	a, b := twoNodes(t)
	rec, capture := repotest.Publish(t, a, "web")
	capture.End()
	if held, err := b.LeaseHeld(bg(), rec.ID); err != nil || held {
		t.Fatalf("LeaseHeld on B before any lease = %v, %v", held, err)
	}
	lease, err := a.LeaseExisting(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := b.LeaseHeld(bg(), rec.ID); err != nil || !held {
		t.Fatalf("LeaseHeld on B while A holds a lease = %v, %v; want true", held, err)
	}
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	if held, err := b.LeaseHeld(bg(), rec.ID); err != nil || held {
		t.Fatalf("LeaseHeld on B after A ended its lease = %v, %v; want false", held, err)
	}
}

// A live holder keeps its lease past the TTL by writing it again; a
// holder that crashed (its lease object is left, no longer written) loses
// it once the TTL has passed, and Sweep removes the object after twice that
// and the abandoned grace.
func TestLeaseRenewedWhileHeldAndExpiresAfterCrash(t *testing.T) {
	t.Parallel()
	a, b := twoNodes(t)
	a.leaseTTL, b.leaseTTL = time.Second, time.Second
	a.abandonedGrace, b.abandonedGrace = 2*time.Second, 2*time.Second
	rec, capture := repotest.Publish(t, a, "web")
	capture.End()
	lease, err := a.LeaseExisting(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	// A crashed holder's object, as a killed daemon leaves it.
	crashed := b.keys.lease(rec.ID, "0190a000-0000-7000-8000-000000000000")
	data, _ := json.Marshal(leaseObject{Format: leaseFormat, ID: rec.ID, Holder: "crashed"})
	if _, err := b.putSmall(bg(), crashed, data, putCondition{}); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	// Three TTLs on, A's renewals keep its lease held.
	waitUntil(t, 10*time.Second, func() bool { return time.Since(written) > 3*b.leaseTTL })
	if held, err := b.LeaseHeld(bg(), rec.ID); err != nil || !held {
		t.Fatalf("LeaseHeld while A renews = %v, %v; want true", held, err)
	}
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	if held, err := b.LeaseHeld(bg(), rec.ID); err != nil || held {
		t.Fatalf("LeaseHeld with only the crashed holder's expired object = %v, %v; want false", held, err)
	}
	if err := b.Sweep(bg()); err != nil {
		t.Fatal(err)
	}
	if found, err := b.exists(bg(), crashed); err != nil || found {
		t.Fatalf("expired lease object after Sweep: found=%v, %v", found, err)
	}
}

// waitUntil polls cond (time passing is what is tested, not an ordering
// between goroutines) and fails after bound.
func waitUntil(t *testing.T, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Claims on two nodes race for one snapshot: exactly one stands. A claim
// whose holder crashed (its object left, no longer written) is taken over
// once it has expired, and only then.
func TestClaimAcrossNodes(t *testing.T) {
	t.Parallel()
	a, b := twoNodes(t)
	rec, capture := repotest.Publish(t, a, "web")
	capture.End()
	start := make(chan struct{})
	stood := make(chan repository.Lease, 4)
	for _, n := range []*Repo{a, a, b, b} {
		go func() {
			<-start
			lz, ok, err := n.ClaimLease(bg(), rec.ID)
			if err != nil {
				t.Errorf("ClaimLease: %v", err)
			}
			if !ok {
				lz = nil
			}
			stood <- lz
		}()
	}
	close(start)
	var won []repository.Lease
	for range 4 {
		if lz := <-stood; lz != nil {
			won = append(won, lz)
		}
	}
	if len(won) != 1 {
		t.Fatalf("%d claims on two nodes stood; want exactly one", len(won))
	}
	won[0].End()

	// A crashed claimer's object, as a killed daemon leaves it.
	b.leaseTTL = time.Second
	data, _ := json.Marshal(leaseObject{Format: leaseFormat, ID: rec.ID, Holder: "crashed"})
	if _, err := a.putSmall(bg(), a.keys.claim(rec.ID), data, putCondition{}); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	if _, ok, err := b.ClaimLease(bg(), rec.ID); err != nil || ok {
		t.Fatalf("ClaimLease beside a live claim = %v, %v; want not claimed", ok, err)
	}
	waitUntil(t, 10*time.Second, func() bool { return time.Since(written) > 2*b.leaseTTL })
	lz, ok, err := b.ClaimLease(bg(), rec.ID)
	if err != nil || !ok {
		t.Fatalf("ClaimLease over an expired claim = %v, %v; want it taken over", ok, err)
	}
	lz.End()
}

// TestSweepKeepsALeaseWrittenSinceItsListing: the sweep removes lease
// objects that look expired, but a holder that writes its object between
// the sweep's listing and its removal (a publisher confirming its lease
// right before its record) lives, and must keep it: a removed object
// would let a collector take the publish for dead while its record lands.
func TestSweepKeepsALeaseWrittenSinceItsListing(t *testing.T) {
	holder, collector := twoNodes(t)
	lease := beginCapture(t, holder)
	id := lease.SnapshotID()
	// To the collector every lease object looks expired and silent.
	collector.leaseTTL, collector.abandonedGrace = time.Nanosecond, time.Nanosecond
	confirmed := false
	collector.beforeSweepLease = func(key string) {
		if strings.Contains(key, id) && !confirmed {
			confirmed = true
			if err := holder.confirmLease(bg(), id); err != nil {
				t.Errorf("the holder's confirmation before the sweep's removal: %v", err)
			}
		}
	}
	if err := collector.Sweep(bg()); err != nil {
		t.Fatal(err)
	}
	if !confirmed {
		t.Fatal("the sweep found no lease object to remove")
	}
	if err := holder.confirmLease(bg(), id); err != nil {
		t.Errorf("the lease object written since the sweep listed it was taken: %v", err)
	}
}
