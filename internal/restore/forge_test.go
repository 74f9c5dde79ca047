package restore_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
)

// A writer of the store who patches a page the guest touches and keeps
// the page's CRC-32C with a 4-byte fix-up (the attack a CRC table cannot
// see) is refused on both devices, prefetch on and off: the table a
// publish writes is of SHA-256 digests, which no fix-up keeps.
func TestCRCPreservingPatchIsNotServed(t *testing.T) {
	e := newEnv(t, envOptions{})
	touched, _ := pagesOf(t, e)
	path := e.source(t).MemoryPath
	backup, putBack := setAside(t, path)
	defer putBack()
	copyFile(t, backup, path)
	repotest.PatchKeepingCRC(t, path, touched)
	for _, device := range devices {
		for _, mode := range []restore.Mode{restore.ModeOn, restore.ModeOff} {
			inst, err := e.resolveAndRestore(device, mode)
			if err == nil {
				got := inst.Ready.Detail["sha256"]
				stop(t, inst)
				t.Fatalf("%s/%s: a page patched to keep its CRC-32C was served (guest read sha256 %s, published %s)",
					device, mode, got, e.ref.expected)
			}
			if !errors.Is(err, repository.ErrIntegrity) || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", touched)) {
				t.Errorf("%s/%s: restore = %v, want an integrity error naming the block at %d", device, mode, err, touched)
			}
		}
	}
}
