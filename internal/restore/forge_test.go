package restore_test

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/trust"
)

// A writer of the store who patches a page the guest touches and keeps
// the page's CRC-32C with a 4-byte fix-up (the attack a CRC table cannot
// see) is refused on both devices by a node that trusts the publisher:
// there the restore checks the table of SHA-256 digests, which no fix-up
// keeps. (A node that trusts no key checks CRC-32C: whoever can patch the
// page there can rewrite both tables and the record with it, failure 3,
// and only a signature stops that.)
func TestCRCPreservingPatchIsNotServed(t *testing.T) {
	e := newEnv(t, envOptions{})
	publisher := e.sign(t)
	touched, _ := pagesOf(t, e)
	path := e.memoryPath(t)
	backup, putBack := setAside(t, path)
	defer putBack()
	copyFile(t, backup, path)
	repotest.PatchKeepingCRC(t, path, touched)
	trusting := e.trusting(trust.Key{Public: publisher.Private.Public().(ed25519.PublicKey)})
	for _, device := range devices {
		inst, err := e.restoreWith(trusting, device)
		if err == nil {
			got := inst.Ready.Detail.SHA256
			stop(t, inst)
			t.Fatalf("%s: a page patched to keep its CRC-32C was served (guest read sha256 %s, published %s)",
				device, got, e.ref.expected)
		}
		if !errors.Is(err, repository.ErrIntegrity) || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", touched)) ||
			!strings.Contains(err.Error(), "SHA-256") {
			t.Errorf("%s: restore = %v, want an integrity error naming the block at %d and its SHA-256", device, err, touched)
		}
	}
}
