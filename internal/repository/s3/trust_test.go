package s3

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
	"warmstart/internal/trust"
)

// TestTwoNodesOnOneBucketTrustThePublisher: a publisher node signs what
// it publishes; a second node, with its own cache, that trusts the
// publisher's public key restores it. Once a writer of the bucket swaps
// the VM state and rewrites the record to match (what bucket write
// credentials allow), the trusting node refuses the snapshot before any
// memory is served, and says the record changed after it was signed.
func TestTwoNodesOnOneBucketTrustThePublisher(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	key := repotest.NewSigningKey(t)
	o := testOptions(t, w.endpoint)
	o.Prefix, o.SigningKey = w.prefix, key
	publisher := openWith(t, o)
	snap := w.publish(t, publisher, 7)

	node := w.repo(t, 0)
	w.restorer.Trust = trust.NewPolicy(trust.Key{Public: key.Public().(ed25519.PublicKey)})
	t.Cleanup(func() { w.restorer.Trust = nil })
	inst := w.restoreOK(t, node, snap, restore.ModeOn)
	if err := inst.Stop(bg()); err != nil {
		t.Fatal(err)
	}

	rec, _, err := publisher.getRecord(bg(), snap.id)
	if err != nil {
		t.Fatal(err)
	}
	forged := []byte("a VM state of the attacker's")
	if _, err := publisher.putSmall(bg(), publisher.keys.artifact(snap.id, repository.VMStateFileName), forged, putCondition{}); err != nil {
		t.Fatal(err)
	}
	rec.VMStateSize, rec.VMStateSHA256 = int64(len(forged)), sha256Hex(forged)
	if _, err := publisher.putRecord(bg(), rec, putCondition{}); err != nil {
		t.Fatal(err)
	}
	_, err = w.restore(t, w.repo(t, 0), snap, restore.ModeOn)
	var re *trust.RefusedError
	if !errors.As(err, &re) || !errors.Is(err, trust.ErrUntrusted) || re.Snapshot != snap.id ||
		!strings.Contains(err.Error(), "changed after it was signed by trusted key "+repository.KeyID(key.Public().(ed25519.PublicKey))) {
		t.Fatalf("restore of the rewritten record = %v; want a refusal naming %s and the change", err, snap.id)
	}
}
